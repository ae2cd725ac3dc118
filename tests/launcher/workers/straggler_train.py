"""Real torch.distributed (gloo): fixed "compute" per step timed with kcover.timed, an all_reduce outside it.

The compute is 30 chunks of a small matmul and a 1 ms sleep, like a rank waiting on its GPU: a SIGSTOP
throttle slows it as it would slow real work, while CPU contention on a small loaded test machine (more
ranks than cores) barely does, so the test judges the detector and not the machine.

STEPS (default 120) steps; rank 0 does 30% extra work every 10th step (uneven by design); every 10
steps rank 0 saves the step to KCOVER_CHECKPOINT_DIR and reports it, and a restart resumes from it.
DIE_RANK / DIE_STEP: that rank exits 3 at that step (first attempt only), at once, as a crash would.
"""
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

import kcover

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.set_num_threads(1)
steps = int(os.environ.get("STEPS", "120"))
saved = Path(os.environ["KCOVER_CHECKPOINT_DIR"]) / "step.txt"
start = int(saved.read_text()) + 1 if saved.exists() else 0
first_attempt = os.environ["KCOVER_RESTART_COUNT"] == "0"
matrix = torch.randn(32, 32)
for step in range(start, steps):
    if first_attempt and str(rank) == os.environ.get("DIE_RANK") and step == int(os.environ.get("DIE_STEP", "-1")):
        sys.stdout.flush()
        os._exit(3)  # sys.exit with gloo's threads alive sometimes ends in std::terminate (SIGABRT), not 3
    timer = kcover.timed(step)
    with timer:
        work = 39 if rank == 0 and step % 10 == 0 else 30
        for _ in range(work):
            result = torch.tanh(matrix @ matrix * 0.01)
            time.sleep(0.001)
    if os.environ.get("PRINT_TIMES"):
        print(f"time {step} {time.perf_counter() - timer.began:.5f}", flush=True)
    total = torch.ones(1)
    dist.all_reduce(total)
    kcover.progress(step)
    if rank == 0 and step % 10 == 0:
        saved.parent.mkdir(parents=True, exist_ok=True)
        saved.write_text(str(step))
        kcover.checkpointed(step)
    if step % 20 == 0:
        print(f"step {step}", flush=True)
dist.destroy_process_group()
