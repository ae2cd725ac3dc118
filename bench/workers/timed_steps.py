"""The straggler tests' workload: gloo all_reduce per step, compute timed with ``kcover.timed``.

The compute is 30 chunks of a small matmul and a 1 ms sleep (a rank waiting on its GPU); rank 0 does
30% extra every 10th step (uneven by design).  Each rank prints ``time <step> <seconds>`` per step.
With RESUME=1 rank 0 saves its step every 10 steps to ``KCOVER_CHECKPOINT_DIR`` and a restart resumes there.
"""
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

import kcover

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.set_num_threads(1)
matrix = torch.randn(32, 32)
resume = os.environ.get("RESUME") == "1"
saved = Path(os.environ["KCOVER_CHECKPOINT_DIR"]) / "step.txt"
start = int(saved.read_text()) + 1 if resume and saved.exists() else 0
for step in range(start, int(os.environ.get("STEPS", "200"))):
    timer = kcover.timed(step)
    with timer:
        for _ in range(39 if rank == 0 and step % 10 == 0 else 30):
            result = torch.tanh(matrix @ matrix * 0.01)
            time.sleep(0.001)
    print(f"time {step} {time.perf_counter() - timer.began:.6f}", flush=True)
    total = torch.ones(1)
    dist.all_reduce(total)
    kcover.progress(step)
    if resume and rank == 0 and step % 10 == 0:
        saved.parent.mkdir(parents=True, exist_ok=True)
        saved.write_text(str(step))
        kcover.checkpointed(step)
dist.destroy_process_group()
