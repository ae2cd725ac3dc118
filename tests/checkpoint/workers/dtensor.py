"""One gloo rank with a 1-D device mesh: a DTensor state saved as local shards and copied back into place.

Usage: ``dtensor.py DIR``.  Prints ``ok`` when the live DTensors hold the saved values again.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

from kcover.checkpoint import Checkpointer, CheckpointError, copy_into, local_shards

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
dist.init_process_group("gloo", init_method=f"file://{sys.argv[1]}/store", rank=0, world_size=1)
mesh = init_device_mesh("cpu", (1,))
weight = torch.nn.Parameter(distribute_tensor(torch.arange(6.0).reshape(3, 2), mesh, [Shard(0)]))
state = {"model": {"weight": weight}, "optimizer": {"state": {0: {"step": 3}}}}
with Checkpointer(sys.argv[1] + "/ckpt", shared_memory=None, emergency_save=False) as checkpointer:
    try:
        checkpointer.save(1, state)
        raise SystemExit("a DTensor leaf was accepted")
    except CheckpointError as exc:
        assert "local_shards" in str(exc), exc
    checkpointer.save(1, local_shards(state))
    with torch.no_grad():
        weight.to_local().zero_()
    restored = checkpointer.load_latest()
assert restored is not None
assert copy_into(state, restored.state) == 1
assert torch.equal(weight.full_tensor().detach(), torch.arange(6.0).reshape(3, 2)), weight
print("ok", flush=True)
dist.destroy_process_group()
