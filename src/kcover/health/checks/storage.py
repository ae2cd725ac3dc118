"""Storage checks on the checkpoint path: write and read throughput, fsync latency, free space.

A job that cannot save a checkpoint quickly loses everything since the last
one, so the path checked is where checkpoints go: ``storage.path``, else
``KCOVER_CHECKPOINT_DIR``, else the current directory.  Write throughput
includes the final ``fsync`` (data on disk, not in the page cache); the read
test drops its file from the page cache first (``posix_fadvise DONTNEED``),
which a network or overlay file system may ignore — then the figure is the
cache's.  Scratch files are named ``.kcover-health-*`` and always removed.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import time
from collections.abc import Iterator
from pathlib import Path

from kcover.health.model import Outcome, Status
from kcover.health.registry import CheckContext, register

_BLOCK = 4 << 20


@contextlib.contextmanager
def scratch_file(folder: Path, tag: str) -> Iterator[Path]:
    """A file of this check's own in ``folder``, removed afterwards.  Named by a random token: the agents of
    many nodes check one shared folder, each as pid 1 of its container, and a name by pid was the same file."""
    path = folder / f".kcover-health-{tag}-{secrets.token_hex(8)}"
    try:
        yield path
    finally:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def write_file(path: Path, size_bytes: int) -> float:
    """Write ``size_bytes`` and fsync; seconds taken."""
    block = os.urandom(min(_BLOCK, size_bytes))
    started = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        left = size_bytes
        while left > 0:
            left -= os.write(fd, block[: min(left, len(block))])
        os.fsync(fd)
    finally:
        os.close(fd)
    return time.perf_counter() - started


def read_file(path: Path) -> tuple[int, float]:
    """Drop ``path`` from the page cache, read it whole; bytes and seconds."""
    fd = os.open(path, os.O_RDONLY)
    try:
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        total, started = 0, time.perf_counter()
        while chunk := os.read(fd, _BLOCK):
            total += len(chunk)
        return total, time.perf_counter() - started
    finally:
        os.close(fd)


def fsync_latencies(path: Path, samples: int) -> list[float]:
    """Seconds of each of ``samples`` 4 KiB write + fsync pairs (what a checkpoint commit marker costs)."""
    latencies = []
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for index in range(samples):
            os.pwrite(fd, os.urandom(4096), index * 4096)
            started = time.perf_counter()
            os.fsync(fd)
            latencies.append(time.perf_counter() - started)
    finally:
        os.close(fd)
    return latencies


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def _folder(ctx: CheckContext) -> Path | Outcome:
    folder = ctx.storage_path()
    if not folder.is_dir():
        return Outcome(Status.FAIL, f"checkpoint path {folder} is not a folder")
    if not os.access(folder, os.W_OK):
        return Outcome(Status.FAIL, f"checkpoint path {folder} is not writable")
    return folder


def _floor(value: float, floor: float, text: str, unit: str) -> Outcome:
    status = Status.PASS if value >= floor else Status.FAIL
    return Outcome(status, text, round(value, 1), unit, floor)


@register("storage.write", "write + fsync throughput on the checkpoint path")
class WriteThroughput:
    def run(self, ctx: CheckContext) -> Outcome:
        folder = _folder(ctx)
        if isinstance(folder, Outcome):
            return folder
        cfg = ctx.config.storage
        with scratch_file(folder, "write") as path:
            seconds = write_file(path, cfg.size_mb << 20)
        rate = cfg.size_mb * 1.048576 / seconds
        return _floor(
            rate, cfg.min_write_mb_s, f"{cfg.size_mb} MiB written and fsynced to {folder} at {rate:.0f} MB/s", "MB/s"
        )


@register("storage.read", "read throughput (page cache dropped) on the checkpoint path")
class ReadThroughput:
    def run(self, ctx: CheckContext) -> Outcome:
        folder = _folder(ctx)
        if isinstance(folder, Outcome):
            return folder
        cfg = ctx.config.storage
        with scratch_file(folder, "read") as path:
            write_file(path, cfg.size_mb << 20)
            size, seconds = read_file(path)
        rate = size / 1e6 / seconds
        return _floor(rate, cfg.min_read_mb_s, f"{cfg.size_mb} MiB read from {folder} at {rate:.0f} MB/s", "MB/s")


@register("storage.fsync", "p99 latency of a 4 KiB write + fsync on the checkpoint path")
class FsyncLatency:
    def run(self, ctx: CheckContext) -> Outcome:
        folder = _folder(ctx)
        if isinstance(folder, Outcome):
            return folder
        cfg = ctx.config.storage
        with scratch_file(folder, "fsync") as path:
            latencies = fsync_latencies(path, cfg.fsync_samples)
        p50, p99 = percentile(latencies, 0.5) * 1e3, percentile(latencies, 0.99) * 1e3
        status = Status.PASS if p99 <= cfg.max_fsync_p99_ms else Status.FAIL
        return Outcome(
            status,
            f"fsync p50 {p50:.2f} ms, p99 {p99:.2f} ms over {len(latencies)} samples in {folder}",
            round(p99, 3),
            "ms",
            cfg.max_fsync_p99_ms,
        )


@register("storage.free", "free space on the checkpoint path (absolute and share)")
class FreeSpace:
    def run(self, ctx: CheckContext) -> Outcome:
        folder = ctx.storage_path()
        if not folder.is_dir():
            return Outcome(Status.FAIL, f"checkpoint path {folder} is not a folder")
        stats = os.statvfs(folder)
        free_gb = stats.f_bavail * stats.f_frsize / 1e9
        share = stats.f_bavail / stats.f_blocks if stats.f_blocks else 0.0
        return judge_free(
            free_gb, share, ctx.config.storage.min_free_gb, ctx.config.storage.min_free_fraction, str(folder)
        )


def judge_free(free_gb: float, share: float, min_gb: float, min_share: float, where: str) -> Outcome:
    text = f"{free_gb:.1f} GB free ({share:.0%}) on {where}"
    if free_gb < min_gb or share < min_share:
        return Outcome(Status.FAIL, text + f", below {min_gb:g} GB or {min_share:.0%}", round(free_gb, 2), "GB", min_gb)
    return Outcome(Status.PASS, text, round(free_gb, 2), "GB", min_gb)
