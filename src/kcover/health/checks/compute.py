"""Compute: a matmul burn per GPU, judged against the expected throughput of its model.

Each visible GPU multiplies BF16 matrices for ``compute.seconds`` (all GPUs at
once, one thread each); a GPU below ``min_fraction_of_expected`` of its model's
figure in the table (``compute.models``, data) fails, and so do GPUs that
disagree on the product of the same seeded inputs (a silently wrong GPU).
Without CUDA the check is ``skipped``.  :func:`matmul_burn` is device-agnostic:
the pairwise slow-node test uses it on CPU.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kcover.health.model import Outcome, Status
from kcover.health.registry import CheckContext, register


@dataclass(frozen=True)
class Burn:
    device: str
    tflops: float
    checksum: float


def matmul_burn(torch: Any, device: str, size: int, seconds: float, dtype: Any = None, min_iterations: int = 3) -> Burn:
    """Multiply ``size``² matrices on ``device`` for about ``seconds``; throughput and a checksum."""
    dtype = dtype or (torch.bfloat16 if device.startswith("cuda") else torch.float32)
    generator = torch.Generator(device="cpu").manual_seed(1234)
    a = torch.randn(size, size, generator=generator).to(device=device, dtype=dtype)
    b = torch.randn(size, size, generator=generator).to(device=device, dtype=dtype)
    product = a @ b  # warm-up, and the checksum every GPU must agree on
    checksum = float(product.float().sum().item())
    iterations, started = 0, time.perf_counter()
    while iterations < min_iterations or time.perf_counter() - started < seconds:
        torch.mm(a, b, out=product)
        iterations += 1
        if device.startswith("cuda") and iterations % 10 == 0:
            torch.cuda.synchronize(device)
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)
    elapsed = time.perf_counter() - started
    return Burn(device, 2 * size**3 * iterations / elapsed / 1e12, checksum)


def judge_burns(
    burns: list[Burn],
    names: list[str],
    expected: list[tuple[str, float] | None],
    min_fraction: float,
    max_disagreement: float,
) -> Outcome:
    """Fail the slowest GPU below its model's floor, or any GPU whose checksum disagrees."""
    reference = burns[0].checksum
    for burn in burns:
        scale = max(abs(reference), 1.0)
        if abs(burn.checksum - reference) / scale > max_disagreement:
            return Outcome(
                Status.FAIL,
                f"{burn.device} computes a different result ({burn.checksum!r} vs {reference!r} on {burns[0].device})",
                burn.tflops,
                "TFLOPS",
            )
    ratios = []
    for burn, name, row in zip(burns, names, expected, strict=True):
        if row is not None:
            ratios.append((burn.tflops / row[1], burn, name, row))
    slowest = min(burns, key=lambda b: b.tflops)
    if not ratios:
        return Outcome(
            Status.WARN,
            f"model {names[0]!r} not in compute.models; slowest {slowest.device} {slowest.tflops:.1f} TFLOPS",
            round(slowest.tflops, 2),
            "TFLOPS",
        )
    ratio, burn, name, (model, tflops) = min(ratios, key=lambda item: item[0])
    floor = round(tflops * min_fraction, 1)
    text = f"{burn.device} ({model}) {burn.tflops:.1f} TFLOPS = {ratio:.0%} of {tflops:g}"
    status = Status.FAIL if ratio < min_fraction else Status.PASS
    return Outcome(
        status, text + (" (below the floor)" if status is Status.FAIL else ""), round(burn.tflops, 2), "TFLOPS", floor
    )


def has_nvidia_device(dev: Path = Path("/dev")) -> bool:
    """Cheap test before importing torch (2 s): a GPU has a /dev/nvidia<N> node, also in a container."""
    return any(dev.glob("nvidia[0-9]*"))


@register("compute.matmul", "BF16 matmul burn per GPU vs the expected throughput of its model")
class MatmulBurn:
    def run(self, ctx: CheckContext) -> Outcome:
        if not has_nvidia_device():
            return Outcome.skipped("no NVIDIA GPU (no /dev/nvidia<N> device)")
        try:
            import torch
        except ImportError:
            return Outcome.skipped("torch is not installed")
        if not torch.cuda.is_available():
            return Outcome.skipped("no CUDA GPU (torch.cuda.is_available() is False)")
        cfg = ctx.config.compute
        count = torch.cuda.device_count()
        burns: list[Burn | None] = [None] * count
        errors: list[BaseException] = []

        def work(index: int) -> None:
            try:
                burns[index] = matmul_burn(torch, f"cuda:{index}", cfg.size, cfg.seconds)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(count)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]
        names = [torch.cuda.get_device_name(i) for i in range(count)]
        done = [burn for burn in burns if burn is not None]
        return judge_burns(
            done,
            names,
            [cfg.expected_tflops(name) for name in names],
            cfg.min_fraction_of_expected,
            cfg.max_disagreement,
        )
