"""Run checks, each in its own process with a time budget, and collect a report.

Each check runs in a forked child that leads its own process group.  The
parent waits up to the check's budget for the pickled outcome on a pipe; past
the budget the whole group is killed (SIGKILL, so a check that ignores signals
or spawned helpers is still stopped) and the check is ``fail (timeout)``.  A
check that raises is ``error`` with the exception in one line; a child that
dies without answering is ``error`` with its exit status.  The group is killed
after every check, so nothing a check started outlives it.  One check at a time:
the GPU and collective checks would disturb each other's figures.

Called by ``kcover check``, :func:`kcover.health.preflight.run_preflight` and
the node agent; never raises because of a check.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pickle
import select
import signal
import socket
import sys
import time
import traceback
from collections.abc import Callable, Iterable

from kcover.health import registry
from kcover.health.model import CheckResult, HealthReport, Outcome, Status
from kcover.health.registry import CheckContext

_CHUNK = 65536


def select_checks(suite: list[str], only: Iterable[str] = (), skip: Iterable[str] = ()) -> list[str]:
    """The checks to run: the suite, or ``only`` (in that order), minus ``skip``.

    A name ending in ``.*`` (or a bare prefix such as ``gpu``) selects every
    registered check under it.  Unknown names raise ``KeyError``.
    """
    known = sorted(registry.names())

    def expand(pattern: str) -> list[str]:
        prefix = pattern.removesuffix("*").removesuffix(".")
        hits = [n for n in known if n == pattern or n.startswith(prefix + ".")]
        if not hits:
            raise KeyError(f"unknown health check {pattern!r}; known: {', '.join(known)}")
        return hits

    chosen = [name for pattern in only for name in expand(pattern)] if only else list(suite)
    excluded = {name for pattern in skip for name in expand(pattern)}
    seen: set[str] = set()
    result = []
    for name in chosen:
        if name not in excluded and name not in seen:
            seen.add(name)
            result.append(name)
    return result


def run_checks(
    names: Iterable[str],
    ctx: CheckContext,
    *,
    node: str | None = None,
    on_result: Callable[[CheckResult], None] | None = None,
) -> HealthReport:
    """Run the named checks one after another; a report with one result per check."""
    results = []
    for name in names:
        result = run_one(name, ctx)
        if on_result is not None:
            on_result(result)
        results.append(result)
    return HealthReport(node=node or socket.gethostname(), checks=tuple(results))


def run_one(name: str, ctx: CheckContext, budget: float | None = None) -> CheckResult:
    """Run one registered check in a child process, within ``budget`` seconds (config by default)."""
    entry = registry.get(name)
    seconds = ctx.config.budget(name) if budget is None else budget
    started = time.monotonic()
    outcome = _run_forked(entry.check.run, ctx, seconds)
    return CheckResult.of(name, outcome, time.monotonic() - started)


PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this check if the process that forked it goes away (an agent stopping)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return


def _child(run: Callable[[CheckContext], Outcome], ctx: CheckContext, write_fd: int) -> None:
    """In the child: run the check and write one pickled ``(kind, payload)`` message."""
    try:
        os.setpgid(0, 0)
        _die_with_parent()
        try:
            outcome = run(ctx)
            if not isinstance(outcome, Outcome):
                raise TypeError(f"check returned {type(outcome).__name__}, not Outcome")
            message: tuple[str, object] = ("ok", outcome)
        except BaseException as exc:  # the parent reports it; the child must not unwind into the caller
            frame = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
            where = f" ({os.path.basename(frame.filename)}:{frame.lineno})" if frame else ""
            message = ("error", f"{type(exc).__name__}: {exc}{where}")
        data = pickle.dumps(message)
        view = memoryview(len(data).to_bytes(8, "big") + data)
        while view:
            written = os.write(write_fd, view)
            view = view[written:]
    finally:
        os._exit(0)


def _run_forked(run: Callable[[CheckContext], Outcome], ctx: CheckContext, budget: float) -> Outcome:
    read_fd, write_fd = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child's coverage is not collected
        os.close(read_fd)
        _child(run, ctx, write_fd)
    os.close(write_fd)
    with contextlib.suppress(PermissionError, ProcessLookupError):
        os.setpgid(pid, pid)  # also done in the child; whichever runs first wins the race
    try:
        data, timed_out = _read_until(read_fd, time.monotonic() + budget)
    finally:
        os.close(read_fd)
        _kill_group(pid)
        _, status = os.waitpid(pid, 0)
    if timed_out:
        return Outcome(Status.FAIL, f"timeout: no result within the budget of {budget:g} s; killed")
    if not data:
        return Outcome(Status.ERROR, f"check process died without a result ({_describe_status(status)})")
    kind, payload = pickle.loads(data)
    if kind == "ok":
        assert isinstance(payload, Outcome)
        return payload
    return Outcome(Status.ERROR, f"check raised {payload}")


def _read_until(fd: int, deadline: float) -> tuple[bytes, bool]:
    """The child's message (length-prefixed, so a helper that kept the pipe open cannot stall us)."""
    buffer = b""
    while True:
        if len(buffer) >= 8 and len(buffer) >= 8 + int.from_bytes(buffer[:8], "big"):
            return buffer[8 : 8 + int.from_bytes(buffer[:8], "big")], False
        left = deadline - time.monotonic()
        if left <= 0:
            return b"", True
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            return b"", True
        chunk = os.read(fd, _CHUNK)
        if not chunk:
            return b"", False
        buffer += chunk


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _describe_status(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"killed by signal {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exit status {os.WEXITSTATUS(status)}"
