"""Reading workers' output as it is written: per-rank logs, live classification, progress.

One :class:`OutputPump` watches every worker's stdout, stderr and progress pipe
with ``selectors``.  Each chunk's complete lines are appended to the rank's log
file, optionally echoed (prefixed ``[rankN]:``) to the launcher's stderr,
scanned by the catalog matcher in one call, and searched for training-step
numbers.  A fatal line becomes an event within milliseconds of being flushed.

Progress comes from two places: log lines that name a step (``step 120``,
``iteration 120/5000``, ``global_step=120``) and the optional SDK
(:func:`kcover.progress`) that writes ``<step>`` or ``ckpt <step>`` lines to the
pipe named by ``KCOVER_PROGRESS_FD``.
"""

from __future__ import annotations

import os
import re
import selectors
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from kcover.classify.collector import FaultCollector, SourceInfo
from kcover.classify.matcher import Matcher
from kcover.collect.lines import MAX_LINE_BYTES, clean_block
from kcover.faults import Fault
from kcover.launcher.workers import Worker

_STEP_AT = re.compile(rb"(?:step|iteration|iter)\s*[:=#]?\s*(\d+)")
_WORDS = (b"step", b"iter")
READ_BYTES = 1 << 16
STEP_WINDOW = 4096
FLUSH_SECONDS = 0.5


@dataclass(frozen=True)
class FaultSeen:
    fault: Fault
    at: float


@dataclass(frozen=True)
class ProgressSeen:
    rank: int
    step: int
    at: float
    checkpoint: bool = False


Event = FaultSeen | ProgressSeen


@dataclass
class _Stream:
    worker: Worker
    kind: str  # "out", "err" or "progress"
    carry: bytes = b""


class RankLog:
    """The log file of one rank and the line count the matcher needs."""

    def __init__(self, path: Path, source: SourceInfo) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.source = source
        self.path = path
        self.file = path.open("ab")
        self.lines = 0
        self.flushed = 0.0

    def write(self, block: bytes, now: float) -> None:
        """Append; flushed at most every :data:`FLUSH_SECONDS` (and at close)."""
        self.file.write(block)
        if now - self.flushed >= FLUSH_SECONDS:
            self.file.flush()
            self.flushed = now


class OutputPump:
    """Reads all workers' pipes; yields faults and progress as they appear."""

    def __init__(
        self, matcher: Matcher, collector: FaultCollector, log_dir: Path, echo: BinaryIO | None = None
    ) -> None:
        self.matcher = matcher
        self.collector = collector
        self.log_dir = log_dir
        self.echo = echo
        self.selector = selectors.DefaultSelector()
        self.logs: dict[int, RankLog] = {}

    def add(self, worker: Worker) -> None:
        source = SourceInfo(name=f"rank{worker.rank}", rank=worker.rank, node=worker.node)
        self.logs[worker.rank] = RankLog(self.log_dir / f"rank{worker.rank}.log", source)
        for kind, fd in (("out", worker.process.stdout), ("err", worker.process.stderr)):
            if fd is not None:
                os.set_blocking(fd.fileno(), False)
                self.selector.register(fd.fileno(), selectors.EVENT_READ, _Stream(worker, kind))
        self.selector.register(worker.progress_read, selectors.EVENT_READ, _Stream(worker, "progress"))

    @property
    def open_streams(self) -> int:
        return len(self.selector.get_map())

    def pump(self, timeout: float) -> list[Event]:
        """Read whatever is ready within ``timeout`` seconds."""
        events: list[Event] = []
        for key, _ in self.selector.select(timeout):
            stream: _Stream = key.data
            try:
                data = os.read(key.fd, READ_BYTES)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if not data:
                self._finish(key.fd, stream, events)
                continue
            events.extend(self._feed(stream, stream.carry + data))
        return events

    def drain(self, timeout: float) -> list[Event]:
        """Read until every pipe is closed or ``timeout`` passes."""
        events: list[Event] = []
        deadline = time.monotonic() + timeout
        while self.open_streams and time.monotonic() < deadline:
            events.extend(self.pump(0.05))
        return events

    def _finish(self, fd: int, stream: _Stream, events: list[Event]) -> None:
        self.selector.unregister(fd)
        if stream.carry:
            events.extend(self._feed(stream, stream.carry + b"\n"))

    def _feed(self, stream: _Stream, data: bytes) -> Iterator[Event]:
        cut = max(data.rfind(b"\n"), data.rfind(b"\r"))
        if cut < 0 and len(data) < MAX_LINE_BYTES:
            stream.carry = data
            return
        if cut < 0:
            cut = len(data) - 1
        stream.carry = data[cut + 1 :]
        block = data[: cut + 1]
        now = time.monotonic()
        if stream.kind == "progress":
            yield from _progress_events(stream.worker.rank, block, now)
            return
        yield from self._lines(stream.worker, block, now)

    def _lines(self, worker: Worker, block: bytes, now: float) -> Iterator[Event]:
        log = self.logs[worker.rank]
        log.write(block, now)
        if self.echo is not None:
            prefix = f"[rank{worker.rank}]: ".encode()
            lines = block.rstrip(b"\n").split(b"\n")
            self.echo.write(b"".join(prefix + line + b"\n" for line in lines))
            self.echo.flush()
        cleaned = clean_block(block)
        for hit in self.matcher.scan_block(cleaned, log.lines + 1):
            fault = self.collector.add_hit(log.source, hit)
            if fault is not None:
                yield FaultSeen(fault, now)
        log.lines += cleaned.count(b"\n")
        step = last_step(cleaned)
        if step is not None:
            yield ProgressSeen(worker.rank, step, now)

    def close(self) -> None:
        self.selector.close()
        for log in self.logs.values():
            log.file.close()


def last_step(block: bytes) -> int | None:
    """The last step number a block of log names (``step 12``, ``iteration 12/500``, ``global_step=12``).

    Searched backwards from the end of the block with ``rfind`` (the newest step
    is nearly always in the last line), so a busy log costs microseconds.
    """
    window = block[-STEP_WINDOW:].lower()
    end = len(window)
    while end > 0:
        position = max(window.rfind(word, 0, end) for word in _WORDS)
        if position < 0:
            return None
        before = window[position - 1 : position]
        if not before.isalnum() or window[max(0, position - 7) : position] == b"global_":
            match = _STEP_AT.match(window, position)
            if match:
                return int(match.group(1))
        end = position
    return None


def _progress_events(rank: int, block: bytes, now: float) -> Iterator[ProgressSeen]:
    for line in block.split(b"\n"):
        parts = line.split()
        if len(parts) == 1 and parts[0].isdigit():
            yield ProgressSeen(rank, int(parts[0]), now)
        elif len(parts) == 2 and parts[0] == b"ckpt" and parts[1].isdigit():
            yield ProgressSeen(rank, int(parts[1]), now, checkpoint=True)
