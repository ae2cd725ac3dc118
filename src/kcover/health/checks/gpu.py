"""GPU checks from NVML readings: inventory, ECC, retired/remapped memory, thermals, NVLink, PCIe, Xid.

Each check reads every GPU through :mod:`kcover.health.nvml` and judges the
readings with a pure function (``judge_*``), which the tests drive with
recorded readings (real ``nvidia-smi -q -x`` reports among them).  Without
``nvidia-ml-py`` the readings come from running ``nvidia-smi``.  A check
reports the worst GPU: its value, the threshold and a reason naming the GPU
index.  Without NVML (no driver, no GPU, no ``nvidia-ml-py``) the checks are
``skipped`` — except ``gpu.inventory`` when a GPU count is expected: then a
missing driver is a failure.  ``gpu.xid`` reads the kernel log with kcover's
own fault catalog.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from kcover.health.config import GpuConfig
from kcover.health.model import Outcome, Status
from kcover.health.nvidia_smi import open_nvidia_smi
from kcover.health.nvml import GpuReading, NvmlApi, NvmlUnavailableError, PynvmlApi, read_gpus
from kcover.health.registry import CheckContext, register

Judge = Callable[[list[GpuReading], GpuConfig], Outcome]


def open_nvml(ctx: CheckContext) -> NvmlApi:
    """The NVML session for this run: ``ctx.nvml`` (a saved report, tests), else ``pynvml``, else ``nvidia-smi``."""
    if ctx.nvml is not None:
        return ctx.nvml()
    try:
        return PynvmlApi()
    except NvmlUnavailableError as exc:
        return open_nvidia_smi(str(exc))


def expected_count(ctx: CheckContext) -> int | None:
    if ctx.config.gpu.expected_count is not None:
        return ctx.config.gpu.expected_count
    raw = ctx.getenv("KCOVER_EXPECTED_GPUS")
    return int(raw) if raw and raw.isdigit() else None


def readings_or_skip(ctx: CheckContext) -> list[GpuReading] | Outcome:
    try:
        api = open_nvml(ctx)
    except NvmlUnavailableError as exc:
        return Outcome.skipped(f"no NVIDIA GPU: {exc}")
    readings = read_gpus(api)
    return readings or Outcome.skipped("no NVIDIA GPU: NVML reports 0 devices")


class _Judged:
    judge: Judge

    def run(self, ctx: CheckContext) -> Outcome:
        readings = readings_or_skip(ctx)
        if isinstance(readings, Outcome):
            return readings
        return type(self).judge(readings, ctx.config.gpu)


@register("gpu.inventory", "GPU count seen by NVML vs the expected count")
class Inventory:
    def run(self, ctx: CheckContext) -> Outcome:
        expected = expected_count(ctx)
        try:
            api = open_nvml(ctx)
        except NvmlUnavailableError as exc:
            if expected:
                return Outcome(Status.FAIL, f"{expected} GPUs expected but {exc}", 0, "GPUs", expected)
            return Outcome.skipped(f"no NVIDIA GPU: {exc}")
        return judge_inventory(api.nvmlDeviceGetCount(), expected, api.nvmlSystemGetDriverVersion())


def judge_inventory(count: int, expected: int | None, driver: str) -> Outcome:
    if expected is None:
        if count == 0:
            return Outcome.skipped("no NVIDIA GPU: NVML reports 0 devices")
        return Outcome(Status.PASS, f"{count} GPUs, driver {driver} (no expected count set)", count, "GPUs")
    if count < expected:
        return Outcome(Status.FAIL, f"{count} of {expected} GPUs visible (driver {driver})", count, "GPUs", expected)
    return Outcome(Status.PASS, f"{count} GPUs as expected, driver {driver}", count, "GPUs", expected)


def _worst(
    readings: list[GpuReading], value: Callable[[GpuReading], int | float | None]
) -> tuple[GpuReading, int | float] | None:
    known = [(reading, v) for reading in readings if (v := value(reading)) is not None]
    return max(known, key=lambda pair: pair[1]) if known else None


def judge_ecc(readings: list[GpuReading], cfg: GpuConfig) -> Outcome:
    volatile = _worst(readings, lambda r: r.ecc_volatile_uncorrected)
    aggregate = _worst(readings, lambda r: r.ecc_aggregate_uncorrected)
    if volatile is None and aggregate is None:
        return Outcome.skipped("ECC counters not supported (ECC off or consumer GPU)")
    if volatile and volatile[1] > cfg.max_volatile_uncorrectable_ecc:
        gpu, count = volatile
        return Outcome(
            Status.FAIL,
            f"GPU {gpu.index}: {count} uncorrectable ECC errors since the last reboot",
            count,
            "errors",
            cfg.max_volatile_uncorrectable_ecc,
        )
    if aggregate and aggregate[1] > cfg.max_aggregate_uncorrectable_ecc:
        gpu, count = aggregate
        return Outcome(
            Status.WARN,
            f"GPU {gpu.index}: {count} uncorrectable ECC errors over its lifetime (none since reboot)",
            count,
            "errors",
            cfg.max_aggregate_uncorrectable_ecc,
        )
    worst_value = volatile[1] if volatile else 0
    return Outcome(
        Status.PASS,
        f"no uncorrectable ECC errors on {len(readings)} GPUs",
        worst_value,
        "errors",
        cfg.max_volatile_uncorrectable_ecc,
    )


def judge_memory_rows(readings: list[GpuReading], cfg: GpuConfig) -> Outcome:
    for gpu in readings:
        if gpu.remap_failed:
            return Outcome(
                Status.FAIL, f"GPU {gpu.index}: row remapping failed (no spare rows): replace the GPU", 1, "failures", 0
            )
        if gpu.remap_pending or gpu.retired_pending:
            return Outcome(
                Status.FAIL, f"GPU {gpu.index}: memory repair pending: reset the GPU before use", 1, "pending", 0
            )
    retired = _worst(readings, lambda r: r.retired_pages)
    if retired and retired[1] > cfg.max_retired_pages:
        return Outcome(
            Status.FAIL,
            f"GPU {retired[0].index}: {retired[1]} retired pages",
            retired[1],
            "pages",
            cfg.max_retired_pages,
        )
    remapped = _worst(readings, lambda r: r.remapped_uncorrectable)
    if remapped and remapped[1] > cfg.max_remapped_rows_uncorrectable:
        return Outcome(
            Status.WARN,
            f"GPU {remapped[0].index}: {remapped[1]} rows remapped after uncorrectable errors",
            remapped[1],
            "rows",
            cfg.max_remapped_rows_uncorrectable,
        )
    if retired is None and remapped is None:
        return Outcome.skipped("neither page retirement nor row remapping is supported")
    value = remapped[1] if remapped else (retired[1] if retired else 0)
    return Outcome(
        Status.PASS,
        f"no pending or failed memory repair on {len(readings)} GPUs",
        value,
        "rows" if remapped else "pages",
    )


def judge_thermal(readings: list[GpuReading], cfg: GpuConfig) -> Outcome:
    for gpu in readings:
        bad = [reason for reason in gpu.throttle_reasons if reason in cfg.fail_throttle_reasons]
        if bad:
            return Outcome(
                Status.FAIL,
                f"GPU {gpu.index}: clocks slowed by {', '.join(bad)}",
                gpu.temperature_c,
                "°C",
                cfg.fail_temperature_c,
            )
    hottest = _worst(readings, lambda r: r.temperature_c)
    if hottest is None:
        return Outcome.skipped("temperature not reported")
    gpu, temperature = hottest
    if temperature >= cfg.fail_temperature_c:
        return Outcome(Status.FAIL, f"GPU {gpu.index} at {temperature} °C", temperature, "°C", cfg.fail_temperature_c)
    if temperature >= cfg.warn_temperature_c:
        return Outcome(Status.WARN, f"GPU {gpu.index} at {temperature} °C", temperature, "°C", cfg.warn_temperature_c)
    return Outcome(
        Status.PASS,
        f"hottest GPU {gpu.index} at {temperature} °C, no hardware slowdown",
        temperature,
        "°C",
        cfg.warn_temperature_c,
    )


def judge_nvlink(readings: list[GpuReading], cfg: GpuConfig) -> Outcome:
    if all(gpu.nvlinks_up == 0 and not gpu.nvlinks_down for gpu in readings):
        return Outcome.skipped("no NVLink on these GPUs")
    most = max(gpu.nvlinks_up + len(gpu.nvlinks_down) for gpu in readings)
    for gpu in readings:
        if gpu.nvlinks_down:
            links = ", ".join(map(str, gpu.nvlinks_down))
            return Outcome(Status.FAIL, f"GPU {gpu.index}: NVLink {links} down", gpu.nvlinks_up, "links", most)
    fewest = min(readings, key=lambda gpu: gpu.nvlinks_up)
    if fewest.nvlinks_up < most:
        return Outcome(
            Status.FAIL,
            f"GPU {fewest.index}: {fewest.nvlinks_up} NVLinks, its peers have {most}",
            fewest.nvlinks_up,
            "links",
            most,
        )
    return Outcome(Status.PASS, f"{most} NVLinks up on each of {len(readings)} GPUs", most, "links", most)


def judge_pcie(readings: list[GpuReading], cfg: GpuConfig) -> Outcome:
    measured = [gpu for gpu in readings if gpu.pcie_width is not None]
    if not measured:
        return Outcome.skipped("PCIe link not reported")
    for gpu in measured:
        assert gpu.pcie_width is not None
        current, maximum = gpu.pcie_width
        if maximum and current / maximum < cfg.min_pcie_width_fraction:
            return Outcome(
                Status.WARN, f"GPU {gpu.index}: PCIe link x{current} of x{maximum}", current, "lanes", maximum
            )
        if gpu.pcie_generation and gpu.pcie_generation[1]:
            cur_gen, max_gen = gpu.pcie_generation
            if cur_gen / max_gen < cfg.min_pcie_generation_fraction:
                return Outcome(
                    Status.WARN, f"GPU {gpu.index}: PCIe gen {cur_gen} of {max_gen}", cur_gen, "gen", max_gen
                )
    width = min(gpu.pcie_width[0] for gpu in measured if gpu.pcie_width)
    return Outcome(Status.PASS, f"PCIe links at full width on {len(measured)} GPUs", width, "lanes")


@register("gpu.ecc", "uncorrectable ECC errors, volatile (fail) and aggregate (warn)")
class Ecc(_Judged):
    judge = staticmethod(judge_ecc)


@register("gpu.memory_rows", "retired pages, remapped rows, pending repairs")
class MemoryRows(_Judged):
    judge = staticmethod(judge_memory_rows)


@register("gpu.thermal", "temperature and hardware clock slowdown reasons")
class Thermal(_Judged):
    judge = staticmethod(judge_thermal)


@register("gpu.nvlink", "NVLink links up, and as many as on the other GPUs")
class NvLink(_Judged):
    judge = staticmethod(judge_nvlink)


@register("gpu.pcie", "PCIe link width (and generation) vs the maximum")
class Pcie(_Judged):
    judge = staticmethod(judge_pcie)


@register("gpu.xid", "Xid and other GPU faults in the kernel log, via the fault catalog")
class XidHistory:
    def run(self, ctx: CheckContext) -> Outcome:
        path = Path(ctx.config.gpu.kernel_log)
        try:
            text = read_kernel_log(path)
        except OSError as exc:
            return Outcome.skipped(f"kernel log {path} not readable: {exc.strerror or exc}")
        return judge_kernel_log(text)


def read_kernel_log(path: Path, limit: int = 16 << 20) -> str:
    """The kernel ring buffer (``/dev/kmsg``, read without blocking) or a saved log file."""
    import os

    if str(path) != "/dev/kmsg":
        with path.open("rb") as handle:
            return handle.read(limit).decode("utf-8", "replace")
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    records: list[bytes] = []
    try:
        while sum(len(record) for record in records) < limit:
            try:
                records.append(os.read(fd, 8192))
            except BlockingIOError:
                break
            except BrokenPipeError:  # a record was overwritten while reading; go on
                continue
    finally:
        os.close(fd)
    return b"".join(record.split(b";", 1)[-1] for record in records).decode("utf-8", "replace")


def judge_kernel_log(text: str) -> Outcome:
    from kcover.explain import explain
    from kcover.faults import Category, Severity

    verdict = explain(text)
    gpu = [f for f in verdict.faults if f.category is Category.GPU_HARDWARE]
    fatal = [f for f in gpu if f.severity is Severity.FATAL]
    if fatal:
        first = fatal[0]
        return Outcome(
            Status.FAIL,
            f"{first.title} ({first.rule}), seen {sum(f.count for f in fatal)}×",
            sum(f.count for f in fatal),
            "faults",
            0,
        )
    if gpu:
        return Outcome(Status.WARN, f"{gpu[0].title} ({gpu[0].rule})", sum(f.count for f in gpu), "faults", 0)
    return Outcome(Status.PASS, "no GPU faults in the kernel log", 0, "faults", 0)
