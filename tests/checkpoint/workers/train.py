"""A DDP training under ``kcover run`` using ``Checkpointer()`` as documented.

Snapshots into shared memory every step, persists every 5th, restores with
``load_latest()`` (all ranks agree on the step) and prints where it resumed.
``REPLICAS=N`` keeps each snapshot in N buddies' memory too.
"""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist
from torch import nn

import kcover
from kcover.checkpoint import Checkpointer

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = nn.Linear(8, 1)
ddp = nn.parallel.DistributedDataParallel(model)
optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
checkpointer = Checkpointer(keep_last=2, replicas=int(os.environ.get("REPLICAS", "0")))
restored = checkpointer.load_latest()
start = 0
if restored is not None:
    model.load_state_dict(restored.state["model"])
    optimizer.load_state_dict(restored.state["optimizer"])
    start = restored.step
    print(f"resumed step {start} from {restored.source} attempt {os.environ['KCOVER_ATTEMPT']}", flush=True)
restored = None
for step in range(start + 1, 21):
    loss = ddp(torch.randn(4, 8)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()  # type: ignore[no-untyped-call]
    optimizer.step()
    checkpointer.save(step, {"model": model.state_dict(), "optimizer": optimizer.state_dict()},
                      persist=step % 5 == 0)
    print(f"step {step}", flush=True)
    kcover.progress(step)
    time.sleep(0.05)
checkpointer.close(remove_snapshot=True)
dist.destroy_process_group()
