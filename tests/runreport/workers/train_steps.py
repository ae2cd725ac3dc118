"""A small training without torch: ranks step in lockstep (a file barrier), rank 0 checkpoints every 5 steps.

A frozen rank stops every other rank at its next barrier, as a collective would, so a hang is seen as missing
progress.  Resumes from the newest checkpoint in ``$KCOVER_CHECKPOINT_DIR``.
"""
import os
import sys
import time
from pathlib import Path

import kcover

STEPS = int(os.environ.get("TRAIN_STEPS", "30"))
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
checkpoints = Path(os.environ["KCOVER_CHECKPOINT_DIR"])
barrier = Path(os.environ["KCOVER_STATE_DIR"]) / f"barrier-{os.environ['KCOVER_ATTEMPT']}"
barrier.mkdir(parents=True, exist_ok=True)
saved = checkpoints / "step.txt"
start = int(saved.read_text()) if saved.exists() else 0


def wait_for_all(step: int) -> None:
    (barrier / f".{rank}").write_text(str(step))
    (barrier / f".{rank}").replace(barrier / str(rank))
    while True:
        seen = [int((barrier / str(r)).read_text() or -1) if (barrier / str(r)).exists() else -1
                for r in range(world)]
        if min(seen) >= step:
            return
        time.sleep(0.01)


for step in range(start + 1, STEPS + 1):
    time.sleep(0.1)
    wait_for_all(step)
    print(f"step {step} loss {1.0 / step:.3f}", flush=True)
    kcover.progress(step)
    if rank == 0 and step % 5 == 0:
        checkpoints.mkdir(parents=True, exist_ok=True)
        (checkpoints / ".step.tmp").write_text(str(step))
        (checkpoints / ".step.tmp").replace(saved)
        kcover.checkpointed(step)
print("<script>alert('log line')</script> done", file=sys.stderr, flush=True)
