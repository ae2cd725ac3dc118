"""One gloo rank for ``bench.peer_restore``, on a simulated node (``node-<rank // PER_NODE>``).

Usage: ``replica_rank.py PHASE RANK WORLD PER_NODE STORE ROOT [ARGS]``; shared memory is ``ROOT/shm/node-<k>``,
the checkpoint dir ``ROOT/ckpt``.  Prints one JSON line.

``save MB``: step 1 of an MB-sized state persisted, step 2 in memory only (as a snapshot every step and a
persist every N steps leave it), both replicated to the buddy (``replicas=1``).
``restore``: ``load_latest()``, timed.
``train STEPS EVERY REPLICAS WIDTH``: DDP training of a model of 4 WIDTH-wide layers, a memory snapshot every
EVERY steps; reports each step's time and, after each step, the newest step whose replica is complete.
``alternate STEPS EVERY WIDTH``: the same training with two Checkpointers, one without replicas and one with,
taking turns in blocks of 2 × EVERY steps (two snapshots each, the first EVERY / 2 steps into the block); a
block ends with a ``wait()`` for its replication, timed as part of its last step.  Reports each step's time
and which Checkpointer its block used (0: without replicas, 1: with).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch
import torch.distributed as dist
from bench.checkpoint_speed import make_state
from torch import nn

from kcover.checkpoint import Checkpointer

phase, rank, world, per_node = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
store, root, args = sys.argv[5], Path(sys.argv[6]), sys.argv[7:]
os.environ["KCOVER_NODE"] = f"node-{rank // per_node}"
shm = root / "shm" / os.environ["KCOVER_NODE"]
shm.mkdir(parents=True, exist_ok=True)
torch.set_num_threads(1)
dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
report: dict[str, object] = {}


def training(width: int) -> tuple[Callable[[], dict[str, object]], Callable[[], None]]:
    """DDP over 4 WIDTH-wide layers with Adam: (the state to snapshot, one training step)."""
    torch.manual_seed(0)
    model = nn.Sequential(*(nn.Linear(width, width) for _ in range(4)))
    ddp = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.Adam(ddp.parameters(), lr=1e-4)
    inputs = torch.randn(256, width)

    def step_once() -> None:
        loss = ddp(inputs).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    return lambda: {"model": model.state_dict(), "optimizer": optimizer.state_dict()}, step_once


if phase == "save":
    with Checkpointer(root / "ckpt", rank=rank, world_size=world, shared_memory=shm, emergency_save=False,
                      replicas=1) as checkpointer:
        state = make_state(int(args[0]) << 20)
        checkpointer.save(1, state)
        checkpointer.save(2, state, persist=False)
        checkpointer.wait()
        replication = checkpointer._replication
        assert replication is not None
        report = {"persist": checkpointer.last_persist_seconds, "replicate": replication.last_push_seconds}
        dist.barrier()
elif phase == "restore":
    with Checkpointer(root / "ckpt", rank=rank, world_size=world, shared_memory=shm, emergency_save=False,
                      replicas=1) as checkpointer:
        began = time.perf_counter()
        restored = checkpointer.load_latest()
        report = {"seconds": time.perf_counter() - began, "source": restored.source if restored else None,
                  "step": restored.step if restored else None}
        restored = None
        dist.barrier()
elif phase == "train":
    steps, every, replicas, width = (int(value) for value in args[:4])
    state_now, step_once = training(width)
    times, replicated = [], []
    with Checkpointer(root / f"train-{replicas}", rank=rank, world_size=world, shared_memory=shm,
                      emergency_save=False, replicas=replicas) as checkpointer:
        for step in range(1, steps + 1):
            began = time.perf_counter()
            step_once()
            if step % every == 0:
                checkpointer.save(step, state_now(), persist=False)
            times.append(time.perf_counter() - began)
            done = checkpointer._replication.replicated_step if checkpointer._replication else None
            replicated.append(done if done is not None else 0)
        checkpointer.wait()
        dist.barrier()
        report = {"step_seconds": times, "replicated": replicated}
else:
    steps, every, width = (int(value) for value in args[:3])
    state_now, step_once = training(width)
    times, modes = [], []
    with Checkpointer(root / "alternate-0", rank=rank, world_size=world, shared_memory=shm,
                      emergency_save=False, replicas=0) as without, \
            Checkpointer(root / "alternate-1", rank=rank, world_size=world, shared_memory=shm,
                         emergency_save=False, replicas=1) as with_replicas:
        for step in range(1, steps + 1):
            place = (step - 1) % (2 * every)
            mode = (step - 1) // (2 * every) % 2
            checkpointer = with_replicas if mode else without
            began = time.perf_counter()
            step_once()
            if place % every == every // 2:
                checkpointer.save(step, state_now(), persist=False)
            if place == 2 * every - 1:
                checkpointer.wait()
            times.append(time.perf_counter() - began)
            modes.append(mode)
        dist.barrier()
        report = {"step_seconds": times, "modes": modes}
print(json.dumps(report), flush=True)
dist.destroy_process_group()
