"""A small but real PyTorch DDP training, the workload of ``kcover demo``.

Runs unchanged under ``torchrun`` or ``kcover run``: it reads the standard
``RANK``/``WORLD_SIZE``/``MASTER_ADDR`` variables, uses NCCL when GPUs are
present and gloo otherwise, trains a small MLP on generated data, checkpoints
every ``--checkpoint-every`` steps (atomically: write, fsync, rename) into
``$KCOVER_CHECKPOINT_DIR`` and resumes from the newest checkpoint.  It reports
progress through the optional kcover SDK and in its log lines.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

try:
    from kcover.sdk import checkpointed, progress
except ImportError:  # the script must also run where kcover is not installed
    def progress(step: int) -> None:
        return None

    def checkpointed(step: int) -> None:
        return None


def checkpoint_dir() -> Path:
    return Path(os.environ.get("KCOVER_CHECKPOINT_DIR", "checkpoints"))


def save(model: nn.Module, optimizer: torch.optim.Optimizer, step: int) -> None:
    folder = checkpoint_dir()
    folder.mkdir(parents=True, exist_ok=True)
    partial = folder / f".step-{step}.pt.tmp"
    with partial.open("wb") as out:
        torch.save({"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict()}, out)
        out.flush()
        os.fsync(out.fileno())
    partial.replace(folder / f"step-{step:06d}.pt")


def load_latest(model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    found = sorted(checkpoint_dir().glob("step-*.pt"))
    if not found:
        return 0
    state = torch.load(found[-1], weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return int(state["step"])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--step-seconds", type=float, default=0.25, help="pacing, so people can watch")
    args = parser.parse_args()

    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if backend == "nccl" else torch.device("cpu")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1)).to(device)
    ddp = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
    start = load_latest(model, optimizer)
    if rank == 0:
        print(f"resuming from step {start}" if start else "starting from scratch", flush=True)
    generator = torch.Generator().manual_seed(1234 + rank)
    weights = torch.randn(32, 1, generator=torch.Generator().manual_seed(7))
    for step in range(start + 1, args.steps + 1):
        inputs = torch.randn(64, 32, generator=generator)
        target = inputs @ weights
        loss = nn.functional.mse_loss(ddp(inputs.to(device)), target.to(device))
        optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        print(f"step {step} loss {loss.item():.4f} world {world}", flush=True)
        progress(step)
        if step % args.checkpoint_every == 0:
            if rank == 0:
                save(model, optimizer, step)
            dist.barrier()
            checkpointed(step)
        time.sleep(args.step_seconds)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
