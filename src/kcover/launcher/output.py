"""Reading workers' output as it is written: per-rank logs, live classification, progress.

One :class:`OutputPump` watches every worker's stdout, stderr and progress pipe
with ``selectors``.  Each chunk's complete lines are appended to the rank's log
file, optionally echoed (prefixed ``[rankN]:``) to the launcher's stderr,
scanned by the catalog matcher in one call, and searched for training-step
numbers.  A fatal line becomes an event within milliseconds of being flushed.

A ready pipe is read until it is drained (its buffer enlarged to
:data:`PIPE_BYTES` where the kernel allows), but at most :data:`STREAM_BUDGET`
bytes per wake-up, so a rank writing at disk speed neither blocks in
``write()`` nor starves the other ranks or the supervision loop; ``busy`` tells
the loop not to pause before the next wake-up.

Writing a log can fail (a full or broken state dir): that log is then given up,
one :class:`LogTrouble` event says so, and reading, classification and progress
go on, so the workers stay supervised.  Echo failures (a closed stderr) only
turn the echo off.

Progress comes from two places: log lines that name a step (``step 120``,
``iteration 120/5000``, ``global_step=120``) and the optional SDK
(:func:`kcover.progress`) that writes ``<step>`` or ``ckpt <step>`` lines to the
pipe named by ``KCOVER_PROGRESS_FD``.  On the same pipe :func:`kcover.step_time`
writes ``time <step> <seconds>``: a :class:`TimingSeen` for the straggler detector
(a value that is not a number is ignored; the detector refuses the rest).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import selectors
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from kcover.classify.collector import FaultCollector
from kcover.classify.matcher import Matcher
from kcover.collect.lines import MAX_LINE_BYTES, clean_block
from kcover.collect.sources import SourceInfo
from kcover.faults import Fault
from kcover.launcher.workers import Worker
from kcover.steps import last_step

READ_BYTES = 1 << 16
STREAM_BUDGET = 1 << 20
"""Bytes read from one stream per wake-up: enough to drain a full pipe, bounded so others get their turn."""
PIPE_BYTES = 1 << 20
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


@dataclass(frozen=True)
class TimingSeen:
    """A rank's compute seconds of one step (:func:`kcover.step_time`), for the straggler detector."""

    rank: int
    step: int
    seconds: float


@dataclass(frozen=True)
class LogTrouble:
    """A rank log could not be written; said once per pump."""

    text: str


Event = FaultSeen | ProgressSeen | TimingSeen | LogTrouble


@dataclass
class _Stream:
    worker: Worker
    kind: str  # "out", "err" or "progress"
    carry: bytes = b""
    after_cr: bool = False  # the last block ended in \r: a \n that comes next completes a \r\n


class RankLog:
    """The log file of one rank and the line count the matcher needs; write errors end the file, not the run."""

    def __init__(self, path: Path, source: SourceInfo) -> None:
        self.source = source
        self.path = path
        self.lines = 0
        self.flushed = 0.0
        self.file: BinaryIO | None = None
        self.error: OSError | None = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self.file = path.open("ab")
        except OSError as exc:
            self.error = exc

    def write(self, block: bytes, now: float) -> OSError | None:
        """Append; flushed at most every :data:`FLUSH_SECONDS` (and at close).  Returns a new write error."""
        if self.file is None:
            return None
        try:
            self.file.write(block)
            if now - self.flushed >= FLUSH_SECONDS:
                self.file.flush()
                self.flushed = now
        except OSError as exc:
            self.error = exc
            self.close()
            return exc
        return None

    def close(self) -> None:
        """Flush and close; a failing flush (full disk) is remembered, never raised."""
        if self.file is None:
            return
        try:
            self.file.close()
        except OSError as exc:
            self.error = self.error or exc
        self.file = None


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
        self.busy = False
        self._said_trouble = False
        self._pending: list[Event] = []

    def add(self, worker: Worker) -> None:
        path = self.log_dir / f"rank{worker.rank}.log"
        source = SourceInfo(name=str(path.resolve()), rank=worker.rank, node=worker.node)
        log = self.logs[worker.rank] = RankLog(path, source)
        if log.error is not None:
            self._pending.extend(self._trouble(log, log.error))
        for kind, fd in (("out", worker.process.stdout), ("err", worker.process.stderr)):
            if fd is not None:
                os.set_blocking(fd.fileno(), False)
                _enlarge_pipe(fd.fileno())
                self.selector.register(fd.fileno(), selectors.EVENT_READ, _Stream(worker, kind))
        self.selector.register(worker.progress_read, selectors.EVENT_READ, _Stream(worker, "progress"))

    @property
    def open_streams(self) -> int:
        return len(self.selector.get_map())

    def pump(self, timeout: float) -> list[Event]:
        """Read whatever is ready within ``timeout`` seconds, each ready pipe until drained or its budget is used."""
        events, self._pending = self._pending, []
        self.busy = False
        for key, _ in self.selector.select(timeout):
            self._read(key.fd, key.data, events)
        return events

    def drain(self, timeout: float) -> list[Event]:
        """Read until every pipe is closed or ``timeout`` passes."""
        events: list[Event] = []
        deadline = time.monotonic() + timeout
        while self.open_streams and time.monotonic() < deadline:
            events.extend(self.pump(0.05))
        return events

    def _read(self, fd: int, stream: _Stream, events: list[Event]) -> None:
        chunks, closed = _read_available(fd)
        taken = sum(len(chunk) for chunk in chunks)
        self.busy = self.busy or taken >= READ_BYTES
        if chunks:
            events.extend(self._feed(stream, stream.carry + b"".join(chunks)))
        if closed:
            self._finish(fd, stream, events)

    def _finish(self, fd: int, stream: _Stream, events: list[Event]) -> None:
        self.selector.unregister(fd)
        if stream.carry:
            events.extend(self._feed(stream, stream.carry + b"\n"))

    def _feed(self, stream: _Stream, data: bytes) -> Iterator[Event]:
        if stream.after_cr and data.startswith(b"\n"):  # a \r\n split across two reads is one line break
            data = data[1:]
            if stream.kind != "progress":
                log = self.logs[stream.worker.rank]
                error = log.write(b"\n", time.monotonic())
                if error is not None:
                    yield from self._trouble(log, error)
        stream.after_cr = False
        cut = max(data.rfind(b"\n"), data.rfind(b"\r"))  # a line ending in \r is read now, not at the next write
        if cut < 0 and len(data) < MAX_LINE_BYTES:
            stream.carry = data
            return
        if cut < 0:
            cut = len(data) - 1
        stream.carry = data[cut + 1 :]
        block = data[: cut + 1]
        stream.after_cr = block.endswith(b"\r") and not stream.carry
        now = time.monotonic()
        if stream.kind == "progress":
            yield from _progress_events(stream.worker.rank, block, now)
            return
        yield from self._lines(stream.worker, block, now)

    def _lines(self, worker: Worker, block: bytes, now: float) -> Iterator[Event]:
        log = self.logs[worker.rank]
        error = log.write(block, now)
        if error is not None:
            yield from self._trouble(log, error)
        self._echo(worker.rank, block)
        cleaned = clean_block(block)
        for hit in self.matcher.scan_block(cleaned, log.lines + 1):
            fault = self.collector.add_hit(log.source, hit)
            if fault is not None:
                yield FaultSeen(fault, now)
        log.lines += cleaned.count(b"\n")
        self.collector.keep_tail(log.source, cleaned, log.lines)
        step = last_step(cleaned)
        if step is not None:
            yield ProgressSeen(worker.rank, step, now)

    def _echo(self, rank: int, block: bytes) -> None:
        if self.echo is None:
            return
        prefix = f"[rank{rank}]: ".encode()
        try:
            self.echo.write(prefix + block.rstrip(b"\n").replace(b"\n", b"\n" + prefix) + b"\n")
            self.echo.flush()
        except (OSError, ValueError):  # stderr closed or broken: the logs and the verdict do not need it
            self.echo = None

    def _trouble(self, log: RankLog, error: OSError) -> Iterator[LogTrouble]:
        """One :class:`LogTrouble` for the first log that fails; later failures are silent."""
        if self._said_trouble:
            return
        self._said_trouble = True
        yield LogTrouble(
            f"cannot write {log.path}: {error.strerror or error}; worker output is no longer logged there "
            "(classification, progress and supervision go on)"
        )

    def close(self) -> None:
        self.selector.close()
        for log in self.logs.values():
            log.close()


def _read_available(fd: int) -> tuple[list[bytes], bool]:
    """What one pipe holds now, up to :data:`STREAM_BUDGET` bytes; and whether it reached end of file."""
    chunks: list[bytes] = []
    taken = 0
    while taken < STREAM_BUDGET:
        try:
            data = os.read(fd, READ_BYTES)
        except BlockingIOError:
            return chunks, False
        except OSError:
            return chunks, True
        if not data:
            return chunks, True
        chunks.append(data)
        taken += len(data)
        if len(data) < READ_BYTES:
            return chunks, False
    return chunks, False


def _enlarge_pipe(fd: int) -> None:
    """Give a chatty rank room to write while a wake-up is processed; keep the default where refused."""
    with contextlib.suppress(OSError, AttributeError):
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)


def _progress_events(rank: int, block: bytes, now: float) -> Iterator[ProgressSeen | TimingSeen]:
    for line in block.split(b"\n"):
        parts = line.split()
        if len(parts) == 1 and parts[0].isdigit():
            yield ProgressSeen(rank, int(parts[0]), now)
        elif len(parts) == 2 and parts[0] == b"ckpt" and parts[1].isdigit():
            yield ProgressSeen(rank, int(parts[1]), now, checkpoint=True)
        elif len(parts) == 3 and parts[0] == b"time" and parts[1].isdigit() and len(parts[2]) <= 32:
            with contextlib.suppress(ValueError):
                yield TimingSeen(rank, int(parts[1]), float(parts[2]))
