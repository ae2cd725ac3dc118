"""Real torch.distributed (gloo): rank 1 stops calling all_reduce at step 3 (first attempt, or always)."""
import os
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
first_attempt = os.environ["TORCHELASTIC_RESTART_COUNT"] == "0"
for step in range(6):
    if rank == 1 and step == 3 and (first_attempt or os.environ.get("HANG_EVERY_TIME") == "1"):
        time.sleep(3600)
    tensor = torch.ones(4) * rank
    dist.all_reduce(tensor)
    print(f"step {step} sum {tensor[0].item()}", flush=True)
dist.destroy_process_group()
