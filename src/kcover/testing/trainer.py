"""The training real-node tests and benchmarks run inside pods: gloo DDP, kcover.checkpoint.

Run as ``python -m kcover.testing.trainer`` (needs torch; nothing imports it).

Rank and world come from ``RANK`` (set by a launcher such as ``kcover pod``) or
``JOB_COMPLETION_INDEX`` (an Indexed Job's pod index), and ``WORLD_SIZE``; the
ranks meet at ``MASTER_ADDR:MASTER_PORT``.  Every step is snapshotted to memory
(``KCOVER_SHARED_MEMORY``); every ``PERSIST_EVERY`` steps the snapshot is also
written to ``KCOVER_CHECKPOINT_DIR``; on SIGTERM the Checkpointer persists the
newest snapshot before the process ends.  It prints ``rank R joined the process
group of W`` after the rendezvous, ``resumed from step N (source)`` once and
``step N loss X`` per step, then sleeps ``STEP_SECONDS``; after ``STEPS`` steps
it prints ``done`` and exits 0.  ``REPLICAS=N`` keeps each snapshot in the memory of N
buddy ranks on other nodes too (the shared-memory folder is created if missing).
A hang on demand: when the file ``HANG_FILE`` exists, rank ``HANG_RANK`` removes it
after step ``HANG_AFTER`` and stops stepping (its peers then wait in the collective).
What kcover.checkpoint says at INFO and above (where a step was restored from, a replica that
could not be pushed or fetched) goes to stderr, so a test that fails can show it.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from kcover import sdk
from kcover.checkpoint import Checkpointer


def main() -> None:
    logging.basicConfig(format="%(name)s %(levelname)s: %(message)s")
    logging.getLogger("kcover.checkpoint").setLevel(logging.INFO)
    rank = int(os.environ.get("RANK", os.environ.get("JOB_COMPLETION_INDEX", "0")))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    os.environ["RANK"] = str(rank)
    steps = int(os.environ.get("STEPS", "1000"))
    persist_every = int(os.environ.get("PERSIST_EVERY", "10"))
    pace = float(os.environ.get("STEP_SECONDS", "0.1"))
    if world > 1:
        dist.init_process_group("gloo", rank=rank, world_size=world)
        print(f"rank {rank} joined the process group of {world}", flush=True)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    ddp: nn.Module = nn.parallel.DistributedDataParallel(model) if world > 1 else model
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
    if os.environ.get("KCOVER_SHARED_MEMORY"):
        Path(os.environ["KCOVER_SHARED_MEMORY"]).mkdir(parents=True, exist_ok=True)
    checkpoints = Checkpointer(rank=rank, world_size=world, replicas=int(os.environ.get("REPLICAS", "0")))
    restored = checkpoints.load_latest()
    start = 0
    if restored is not None:
        model.load_state_dict(restored.state["model"])
        optimizer.load_state_dict(restored.state["optimizer"])
        start = restored.step
    print(f"resumed from step {start} ({restored.source if restored else 'scratch'})", flush=True)
    hang_file = Path(os.environ["HANG_FILE"]) if os.environ.get("HANG_FILE") else None
    hang_after, hang_rank = int(os.environ.get("HANG_AFTER", "0")), int(os.environ.get("HANG_RANK", "0"))
    generator = torch.Generator().manual_seed(1000 + rank)
    for step in range(start + 1, steps + 1):
        inputs = torch.randn(32, 16, generator=generator)
        loss = nn.functional.mse_loss(ddp(inputs), inputs.sum(dim=1, keepdim=True))
        optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
        checkpoints.save(step, state, persist=step % persist_every == 0)
        print(f"step {step} loss {loss.item():.4f}", flush=True)
        sdk.progress(step)
        if hang_file is not None and rank == hang_rank and step >= hang_after and hang_file.exists():
            hang_file.unlink()
            print(f"rank {rank} stops stepping after step {step}", flush=True)
            time.sleep(3600)
        time.sleep(pace)
    checkpoints.close()
    if world > 1:
        dist.destroy_process_group()
    print("done", flush=True)


if __name__ == "__main__":
    main()
