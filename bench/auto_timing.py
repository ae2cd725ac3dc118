"""The cost of kcover's automatic DDP step timing (``kcover/launcher/autotime``), against the step it times.

One process, torch's gloo at world size 1, the straggler tests' workload as a DDP model (30 chunks of a
small matmul and a 1 ms sleep in the forward, like a rank waiting on its GPU).  In the same run:

- **A/B**: two identical DDP models, one built with kcover's timer (its timings written to a pipe a thread
  reads, as under ``kcover run``) and one without; blocks of steps alternate between them, and the median
  step of each is compared (the baseline is the untimed model's step);
- **direct cost**: the timer's own work per step (the forward pre-hook, each parameter's gradient hook and
  the pipe write) called in a loop, as a share of the untimed step (target ≤ 0.5%);
- **a compute-bound model** (a 4-layer MLP of 2,048 units, no sleep): the same A/B and direct cost;
- the direct cost per parameter tensor, on a model of 1,000 of them (it grows with their number);
- with ``--live``: a real ``kcover run`` of 4 gloo ranks of a DDP script that never calls kcover
  (``tests/launcher/workers/ddp_train.py``), rank 2 throttled 1.2x from step 40: which ranks are flagged,
  and from which step.

    python -m bench.auto_timing [--rounds 10] [--steps 20] [--live]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from kcover.launcher.workers import load_auto_timing
from kcover.ports import free_port


class Chunks(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(32, 32)

    def forward(self, batch: torch.Tensor) -> torch.Tensor:
        for _ in range(30):
            batch = torch.tanh(self.layer(batch) * 0.01)
            time.sleep(0.001)
        return batch


def mlp() -> torch.nn.Module:
    layers: list[torch.nn.Module] = []
    for _ in range(4):
        layers += [torch.nn.Linear(2048, 2048), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers)


def build(timer: ModuleType, make: Callable[[], torch.nn.Module], timed: bool) -> DistributedDataParallel:
    os.environ["KCOVER_AUTO_TIMING"] = "1" if timed else "0"
    torch.manual_seed(0)
    model = DistributedDataParallel(make())
    assert (model in timer.TIMERS) == timed
    return model


def ab(timer: ModuleType, make: Callable[[], torch.nn.Module], width: int, rounds: int, steps: int
       ) -> tuple[float, float]:
    """Median step seconds: untimed, timed (blocks alternate, the first round of each left out as warm-up)."""
    models = {timed: build(timer, make, timed) for timed in (False, True)}
    optimizers = {timed: torch.optim.SGD(model.parameters(), lr=0.01) for timed, model in models.items()}
    batch = torch.randn(8, width)
    seconds: dict[bool, list[float]] = {False: [], True: []}
    for round_number in range(rounds + 1):
        for timed in (False, True) if round_number % 2 else (True, False):
            for _ in range(steps):
                began = time.perf_counter()
                models[timed](batch).sum().backward()
                optimizers[timed].step()
                optimizers[timed].zero_grad()
                if round_number:
                    seconds[timed].append(time.perf_counter() - began)
    return statistics.median(seconds[False]), statistics.median(seconds[True])


def direct_cost(timer: ModuleType, make: Callable[[], torch.nn.Module], steps: int) -> tuple[float, int]:
    """Seconds of the timer's own work per step (the forward pre-hook, each parameter's gradient hook as
    :func:`attach` makes it, the previous step's write to the pipe), and the number of parameters."""
    model = build(timer, make, True)
    step_timer: Any = timer.TIMERS[model][0]
    reference = weakref.ref(step_timer)
    hooks = [timer._gradient_hook(reference, index) for index, _ in enumerate(model.parameters())]
    began = time.perf_counter()
    for _ in range(steps):
        step_timer.forward_began(model, None)
        for hook in hooks:
            hook(None, None)
    return (time.perf_counter() - began) / steps, len(hooks)


DDP_SCRIPT = Path(__file__).resolve().parent.parent / "tests" / "launcher" / "workers" / "ddp_train.py"


def live(steps: int) -> list[tuple[int, int, float]]:
    """A real throttled run of the DDP script that never calls kcover: (rank, since step, slowdown) flagged."""
    with tempfile.TemporaryDirectory() as folder:
        done = subprocess.run([sys.executable, "-m", "kcover", "run", "--quiet", "--json", "--state-dir", folder,
                               "--nnodes", "4", "--inject", "slow@rank2:factor=1.2:step=40", "--", sys.executable,
                               str(DDP_SCRIPT)], env={**os.environ, "STEPS": str(steps)}, capture_output=True,
                              text=True, timeout=900, check=True)
    return [(s["rank"], s["since_step"], s["slowdown"]) for s in json.loads(done.stdout)["stragglers"]]


def drain(descriptor: int) -> None:
    while os.read(descriptor, 65536):
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--live", action="store_true", help="also a real kcover run with a 1.2x throttled rank")
    parser.add_argument("--live-steps", type=int, default=200)
    options = parser.parse_args()
    torch.set_num_threads(1)
    read, write = os.pipe()
    threading.Thread(target=drain, args=(read,), daemon=True).start()
    os.environ.update({"KCOVER_PROGRESS_FD": str(write), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())})
    dist.init_process_group("gloo", rank=0, world_size=1)
    timer = load_auto_timing()
    timer.patch(torch.nn.parallel.distributed)
    plain, timed = ab(timer, Chunks, 32, options.rounds, options.steps)
    cost, parameters = direct_cost(timer, Chunks, 20_000)
    print(f"test workload (DDP, gloo, world 1): untimed step {plain * 1000:.2f} ms (baseline), "
          f"timed step {timed * 1000:.2f} ms: {timed / plain:.4f}x")
    print(f"timer's own work per step ({parameters} parameters): {cost * 1e6:.1f} us = "
          f"{100 * cost / plain:.3f}% of the untimed step (target <= 0.5%)")
    plain, timed = ab(timer, mlp, 2048, options.rounds, max(2, options.steps // 4))
    cost, parameters = direct_cost(timer, mlp, 20_000)
    print(f"compute-bound MLP (4 x 2048): untimed step {plain * 1000:.2f} ms (baseline), timed "
          f"{timed * 1000:.2f} ms: {timed / plain:.4f}x; the timer's own work ({parameters} parameters) "
          f"{cost * 1e6:.1f} us = {100 * cost / plain:.3f}%")
    wide = lambda: torch.nn.Sequential(*(torch.nn.Linear(4, 4) for _ in range(500)))  # noqa: E731
    cost, parameters = direct_cost(timer, wide, 2_000)
    print(f"a model of {parameters} parameter tensors: the timer's own work {cost * 1e6:.0f} us per step "
          f"({cost * 1e6 / parameters:.2f} us per parameter tensor)")
    dist.destroy_process_group()
    if options.live:
        flagged = live(options.live_steps)
        print(f"live kcover run, 4 ranks of a DDP script without any kcover call, rank 2 throttled 1.2x from "
              f"step 40, {options.live_steps} steps: flagged {flagged or 'nothing'} (rank, since step, slowdown)")


if __name__ == "__main__":
    main()
