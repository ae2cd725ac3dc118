"""Real torch.distributed (gloo, 3 s timeout): rank 0 stops at step 3 on the first attempt (a checkpoint save
that never ends, say) while the other ranks wait for it in all_reduce and time out."""
import datetime
import os
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=3))
rank = dist.get_rank()
for step in range(6):
    if rank == 0 and step == 3 and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
        time.sleep(3600)
    tensor = torch.ones(4) * rank
    dist.all_reduce(tensor)
    print(f"step {step} sum {tensor[0].item()}", flush=True)
dist.destroy_process_group()
