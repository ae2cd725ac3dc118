"""Two ranks whose memory snapshots are one step apart, as when one dies while the other commits.

Usage: ``one_step_apart.py DIR SHM RANK PHASE [STORE]``; PHASE is
- ``save``: rank 0 saves steps 1-3, rank 1 steps 1-2 (memory only; with SHM ``none``, disk only);
- ``redo``: the step after the restored one is redone by rank 1 alone (rank 0 dies before its commit);
- ``restore``: both ranks (gloo, ``STORE``) restore and print ``restored <step> <source> <note>``.
Rank R's state at step S is ``make_state(S + 10 R)``; a redone step's is ``make_state(S + 100 + 10 R)``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import torch.distributed as dist
from tests.checkpoint.states import make_state

from kcover.checkpoint import Checkpointer

directory, rank, phase = Path(sys.argv[1]), int(sys.argv[3]), sys.argv[4]
shm, persist = (None, True) if sys.argv[2] == "none" else (Path(sys.argv[2]), False)
if phase == "restore":
    dist.init_process_group("gloo", init_method=f"file://{sys.argv[5]}", rank=rank, world_size=2)
with Checkpointer(directory, rank=rank, world_size=2, shared_memory=shm, emergency_save=False) as checkpointer:
    if phase == "save":
        for step in range(1, 4 - rank):
            checkpointer.save(step, make_state(step + 10 * rank), persist=persist)
    elif phase == "redo":
        checkpointer.save(3, make_state(3 + 100 + 10 * rank), persist=persist)
    else:
        restored = checkpointer.load_latest()
        print("restored none" if restored is None else
              f"restored {restored.step} {restored.source} {restored.state['note'].replace(' ', '-')}", flush=True)
if phase == "restore":
    dist.destroy_process_group()
