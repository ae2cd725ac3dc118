"""Three Checkpointers in one process, each with a memory-only snapshot, waiting for SIGTERM.

Usage: ``several_savers.py DIR SHM MODE``.  The Checkpointers write to
``DIR/a``, ``DIR/b`` and ``DIR/c``; each persists step 1 and snapshots step 2
(``a``), 3 (``b``), 4 (``c``) in memory only.  MODE ``sleep``: the main thread
sleeps in Python, so the SIGTERM handler runs there; ``replaced``: the script
then installs its own SIGTERM handler, which only sleeps, so the emergency saves
must come from the watcher thread, which then ends the process (status 143);
``closed``: ``b`` is closed before "ready" (its snapshot must not be persisted,
the others' must).
"""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import torch
from tests.checkpoint.states import make_state

from kcover.checkpoint import Checkpointer

directory, shm, mode = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
torch.set_num_threads(1)
checkpointers = {}
for offset, name in enumerate("abc"):
    checkpointer = Checkpointer(directory / name, shared_memory=shm, rank=0, world_size=1)
    checkpointer.save(1, make_state(1))
    checkpointer.wait()
    checkpointer.save(2 + offset, make_state(2 + offset), persist=False)
    checkpointers[name] = checkpointer
if mode == "closed":
    checkpointers["b"].close()
if mode == "replaced":
    signal.signal(signal.SIGTERM, lambda signum, frame: time.sleep(600))
print("ready", flush=True)
time.sleep(600)
