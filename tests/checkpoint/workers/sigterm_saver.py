"""A worker that snapshots step 2 into memory only, then waits to be stopped with SIGTERM.

Usage: ``sigterm_saver.py DIR SHM MODE [RANK STORE]``.  MODE ``sleep``: the main
thread sleeps in Python; ``handler``: the script has its own SIGTERM handler
(exit 7), which must still run; ``barrier``: rank 0 blocks in a gloo barrier
that rank 1 never joins — native code, where no Python handler can run;
``overlap``: step 2 (256 MiB of large tensors) is saved with
``overlap=optimizer``, so its copy is still running when "ready" is printed.
"""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import torch
from tests.checkpoint.states import OVERLAP_SCALE, make_state

from kcover.checkpoint import Checkpointer

directory, shm, mode = sys.argv[1], sys.argv[2], sys.argv[3]
if mode == "handler":
    def handler(signum: int, frame: object) -> None:
        print("user handler ran", flush=True)
        sys.exit(7)

    signal.signal(signal.SIGTERM, handler)
if mode == "barrier":
    import torch.distributed as dist

    rank = int(sys.argv[4])
    dist.init_process_group("gloo", init_method=f"file://{sys.argv[5]}", rank=rank, world_size=2)
    if rank == 1:
        print("ready", flush=True)
        time.sleep(600)

torch.set_num_threads(1)
scale = OVERLAP_SCALE if mode == "overlap" else 1
checkpointer = Checkpointer(directory, shared_memory=shm, rank=0, world_size=1)
checkpointer.save(1, make_state(1, scale))
checkpointer.wait()
optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
checkpointer.save(2, make_state(2, scale), persist=False, overlap=optimizer if mode == "overlap" else None)
print(f"copy in flight: {checkpointer.busy}", file=sys.stderr, flush=True)
print("ready", flush=True)
if mode == "barrier":
    dist.barrier()
else:
    time.sleep(600)
