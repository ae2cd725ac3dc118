"""Two gloo ranks save steps 1 and 2; rank 1's step 2 is then bit-flipped; both must restore step 1.

Usage: ``agree.py DIR RANK STORE``.  Prints ``restored <step> <source>``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import torch
import torch.distributed as dist
from tests.checkpoint.states import assert_state, make_state

from kcover.checkpoint import Checkpointer

directory, rank, store = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
with Checkpointer(directory, rank=rank, world_size=2, shared_memory=None, emergency_save=False) as checkpointer:
    for step in (1, 2):
        checkpointer.save(step, make_state(step + 10 * rank))
    checkpointer.wait()
if rank == 1:
    image = directory / "step-000000000002" / "rank-00001.img"
    data = bytearray(image.read_bytes())
    data[6000] ^= 1
    image.write_bytes(bytes(data))
dist.barrier()
with Checkpointer(directory, rank=rank, world_size=2, shared_memory=None, emergency_save=False) as checkpointer:
    restored = checkpointer.load_latest()
assert restored is not None
assert_state(restored.state, make_state(restored.step + 10 * rank))
print(f"restored {restored.step} {restored.source}", flush=True)
torch.distributed.destroy_process_group()
