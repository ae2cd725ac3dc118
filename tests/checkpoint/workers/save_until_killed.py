"""Saves steps 1, 2, 3, … of a 128 MiB state into shared memory, back to back, until it is killed.

Usage: ``save_until_killed.py DIR SHM MEMORY_SNAPSHOTS``.  Prints ``saved <step>`` after each commit.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from tests.checkpoint.states import make_state

from kcover.checkpoint import Checkpointer

SCALE = 8192  # two 64 MiB tensors: a copy long enough to be killed in

directory, shm, memory_snapshots = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
with Checkpointer(directory, shared_memory=shm, emergency_save=False, memory_snapshots=memory_snapshots) as saver:
    for step in itertools.count(1):
        saver.save(step, make_state(step, SCALE), persist=False)
        print(f"saved {step}", flush=True)
