"""Collective bandwidth: all-reduce bus bandwidth across this node's GPUs (NCCL) or processes (gloo).

With two or more CUDA GPUs, one process per GPU all-reduces ``size_mb`` over
NCCL; without GPUs, ``collective.processes`` local processes do it over gloo on
loopback, which proves the gloo path works and gives a floor, not a
performance figure.  Bus bandwidth follows nccl-tests: algorithm bandwidth
(bytes / time) × 2(n−1)/n.  :func:`timed_allreduce` is shared with the
pairwise slow-node test.
"""

from __future__ import annotations

import multiprocessing
import os
import tempfile
import time
from multiprocessing.connection import Connection
from typing import Any

from kcover.health.model import Outcome, Status
from kcover.health.registry import CheckContext, register


def bus_bandwidth(size_bytes: int, seconds: float, world: int) -> float:
    """nccl-tests' bus bandwidth of one all-reduce, in GB/s."""
    return size_bytes / seconds * 2 * (world - 1) / world / 1e9


def timed_allreduce(torch: Any, size_bytes: int, iterations: int, device: str = "cpu", group: Any = None) -> float:
    """Seconds per all-reduce of ``size_bytes`` in ``group`` (one warm-up, then the median)."""
    dist = torch.distributed
    tensor = torch.ones(size_bytes // 4, dtype=torch.float32, device=device)
    dist.all_reduce(tensor, group=group)
    times = []
    for _ in range(iterations):
        if device.startswith("cuda"):
            torch.cuda.synchronize(device)
        started = time.perf_counter()
        dist.all_reduce(tensor, group=group)
        if device.startswith("cuda"):
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - started)
    return sorted(times)[len(times) // 2]


def _worker(
    rank: int, world: int, store_path: str, backend: str, size_bytes: int, iterations: int, answer: Connection
) -> None:
    import torch
    import torch.distributed as dist

    try:
        device = f"cuda:{rank}" if backend == "nccl" else "cpu"
        if backend == "nccl":
            torch.cuda.set_device(rank)
        torch.set_num_threads(1)
        store = dist.FileStore(store_path, world)  # type: ignore[attr-defined]
        dist.init_process_group(backend, store=store, rank=rank, world_size=world)
        try:
            seconds = timed_allreduce(torch, size_bytes, iterations, device)
        finally:
            dist.destroy_process_group()
        answer.send(("ok", seconds))
    except BaseException as exc:
        answer.send(("error", f"rank {rank}: {type(exc).__name__}: {exc}"))
    finally:
        answer.close()


def measure_allreduce(world: int, backend: str, size_bytes: int, iterations: int, timeout: float) -> float:
    """Slowest rank's seconds per all-reduce among ``world`` local processes."""
    # fork is cheap for gloo (torch is imported once); CUDA must not be initialised before a fork
    method = "spawn" if backend == "nccl" else "fork"
    context: Any = multiprocessing.get_context(method)
    with tempfile.TemporaryDirectory(prefix="kcover-allreduce-") as folder:
        store_path = os.path.join(folder, "store")
        pipes, processes = [], []
        for rank in range(world):
            receive, send = context.Pipe(duplex=False)
            process = context.Process(
                target=_worker, args=(rank, world, store_path, backend, size_bytes, iterations, send), daemon=False
            )
            process.start()
            send.close()
            pipes.append(receive)
            processes.append(process)
        try:
            answers = []
            deadline = time.monotonic() + timeout
            for receive in pipes:
                if not receive.poll(max(0.0, deadline - time.monotonic())):
                    raise TimeoutError(f"all-reduce did not finish within {timeout:g} s")
                answers.append(receive.recv())
        finally:
            for process in processes:
                process.join(timeout=5)
                if process.is_alive():
                    process.kill()
                    process.join()
    errors = [payload for kind, payload in answers if kind == "error"]
    if errors:
        raise RuntimeError(errors[0])
    return max(float(payload) for _, payload in answers)


@register("collective.allreduce", "all-reduce bus bandwidth across the node's GPUs (NCCL) or processes (gloo)")
class AllReduce:
    def run(self, ctx: CheckContext) -> Outcome:
        try:
            import torch
            import torch.distributed as dist
        except ImportError:
            return Outcome.skipped("torch is not installed")
        cfg = ctx.config.collective
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if gpus >= 2 and dist.is_nccl_available():
            backend, world, floor = "nccl", gpus, cfg.min_busbw_gb_s_gpu
        elif dist.is_gloo_available():
            backend, world, floor = "gloo", cfg.processes, cfg.min_busbw_gb_s_cpu
        else:
            return Outcome.skipped("neither NCCL with 2+ GPUs nor gloo is available")
        size = int(cfg.size_mb * (1 << 20)) // 4 * 4
        budget = ctx.config.budget("collective.allreduce")
        seconds = measure_allreduce(world, backend, size, cfg.iterations, timeout=budget)
        busbw = bus_bandwidth(size, seconds, world)
        text = (
            f"{backend} all-reduce of {cfg.size_mb:g} MB across {world} {'GPUs' if backend == 'nccl' else 'processes'}"
        )
        status = Status.PASS if busbw >= floor else Status.FAIL
        return Outcome(status, f"{text}: {busbw:.2f} GB/s bus bandwidth", round(busbw, 3), "GB/s", floor)
