"""kcover's own stdout and stderr, made safe for the places output really goes.

Results go to stdout, which may be a full disk (``> /dev/full``), a pipe whose
reader has gone (``| head -c0``) or a closed descriptor (``>&-``).  Python
would end such a run with a traceback, or lose the output without a word.
:func:`install` puts guarded streams over descriptors 1 and 2:

- the first failed write to stdout raises :class:`OutputError`, which the
  entry point turns into one line on stderr (or, for a closed pipe, a quiet
  exit, as any Unix tool killed by SIGPIPE).  It derives from
  :class:`BaseException` so that no ``except Exception`` on the way (a health
  check runner, a reporter) can swallow it: once stdout is gone the command
  must stop.  Later writes are dropped, so the interpreter's final flush is
  quiet.
- a failed write to stderr is dropped: diagnostics that cannot be shown must
  not stop a training job kcover supervises.
- a descriptor 0, 1 or 2 closed at start is filled with a placeholder, so no
  file kcover opens later (a log, the run database) lands on it and receives
  the output.  The placeholder for stdout is read-only: writing the results
  fails with EBADF and is reported.
- text that cannot be encoded (a lone surrogate from an undecodable file name)
  is written with backslash escapes instead of raising.

Only :mod:`kcover.cli.main` calls :func:`install`; library users keep their streams.
"""

from __future__ import annotations

import errno
import io
import os
import sys


class OutputError(BaseException):
    """Writing kcover's results to stdout failed; ``error`` says why."""

    def __init__(self, error: OSError) -> None:
        super().__init__(error.strerror or str(error))
        self.error = error

    @property
    def closed_pipe(self) -> bool:
        return self.error.errno == errno.EPIPE


class _GuardedStdout(io.FileIO):
    """Descriptor 1: the first failed write raises :class:`OutputError`; later writes are dropped."""

    broken: OSError | None = None
    used = False

    def write(self, data: object) -> int:
        size = len(memoryview(data))  # type: ignore[arg-type]
        if self.broken is not None:
            return size
        self.used = self.used or size > 0
        try:
            return super().write(data)  # type: ignore[arg-type]
        except OSError as error:
            self.broken = error
            raise OutputError(error) from None


class _QuietStderr(io.FileIO):
    """Descriptor 2: a write that fails is dropped; the last line written is kept."""

    last_line = b""

    def write(self, data: object) -> int:
        lines = bytes(data).rstrip(b"\n").rsplit(b"\n", 1)  # type: ignore[call-overload]
        self.last_line = lines[-1] or self.last_line
        try:
            return super().write(data)  # type: ignore[arg-type]
        except OSError:
            return len(memoryview(data))  # type: ignore[arg-type]


_stdout: _GuardedStdout | None = None
_stderr: _QuietStderr | None = None


def _fill_closed_descriptors() -> None:
    for descriptor, mode in ((0, os.O_RDONLY), (1, os.O_RDONLY), (2, os.O_WRONLY)):
        try:
            os.fstat(descriptor)
        except OSError:
            placeholder = os.open(os.devnull, mode)
            if placeholder != descriptor:
                os.dup2(placeholder, descriptor)
                os.close(placeholder)


def _text(raw: io.FileIO, encoding: str, line_buffering: bool) -> io.TextIOWrapper:
    return io.TextIOWrapper(io.BufferedWriter(raw), encoding=encoding, errors="backslashreplace",
                            line_buffering=line_buffering, write_through=raw.fileno() == 2)


def install() -> None:
    """Replace ``sys.stdout`` and ``sys.stderr`` with the guarded streams."""
    _fill_closed_descriptors()
    encoding = getattr(sys.stdout, "encoding", None) or "utf-8"
    interactive = os.isatty(1)
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            stream.flush()
    global _stdout, _stderr
    _stdout, _stderr = _GuardedStdout(1, "w", closefd=False), _QuietStderr(2, "w", closefd=False)
    sys.stdout = _text(_stdout, encoding, interactive)
    sys.stderr = _text(_stderr, encoding, True)


def stdout_used() -> bool:
    """Has anything been written to stdout since :func:`install`?"""
    sys.stdout.flush()
    return _stdout is not None and _stdout.used


def last_stderr_line() -> str:
    """The last line written to stderr (how a command that only exited 2 explained itself)."""
    sys.stderr.flush()
    return _stderr.last_line.decode("utf-8", "replace") if _stderr is not None else ""
