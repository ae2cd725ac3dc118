"""The optional worker-side SDK: tell the supervisor about progress, checkpoints and compute time.

Training scripts need none of this (kcover also reads step numbers from log
lines), but a few calls make hang detection, ETTR and straggler detection exact::

    import kcover
    kcover.progress(step)        # after each optimizer step
    kcover.checkpointed(step)    # after a checkpoint of ``step`` is complete
    kcover.step_time(seconds)    # this rank's compute seconds of the step (not the waiting)

    with kcover.timed(step):     # or: time the compute part of a step
        loss = model(batch); loss.backward()
    dist.all_reduce(...)         # waiting in collectives stays outside

Waiting time cannot show who is slow (every rank waits for the slowest), so the
straggler detector compares compute times across ranks.  Each call is one small
write to a pipe (a few microseconds).  Outside ``kcover run`` (no
``KCOVER_PROGRESS_FD``) all of them do nothing, so the same script runs
unchanged under ``torchrun`` or plain ``python``.  A timing that is not a
positive finite number of seconds is not sent.  A DDP job needs no call at all for
its timings: kcover times it by itself (``kcover/launcher/autotime``); the first
``step_time`` here silences that timer, so a script's own timings win.
"""

from __future__ import annotations

import math
import os
import sys
from time import perf_counter
from types import TracebackType

_FD_VARIABLE = "KCOVER_PROGRESS_FD"
_PIPE_VARIABLE = "KCOVER_PROGRESS_PIPE"
_steps = {"timed": 0, "checked": 0}
"""``timed``: the next step number :func:`step_time` reports when it is not given one; ``checked``: the process
that found its descriptor to be kcover's pipe."""


def _send(text: str) -> None:
    fd = os.environ.get(_FD_VARIABLE)
    if not fd:
        return
    try:
        if _steps["checked"] != os.getpid():
            _check_pipe(int(fd))
            _steps["checked"] = os.getpid()
        os.write(int(fd), text.encode())
    except (OSError, ValueError):
        os.environ.pop(_FD_VARIABLE, None)


def _check_pipe(fd: int) -> None:
    """Refuse a descriptor that is not kcover's pipe (``KCOVER_PROGRESS_PIPE`` names it): a child process
    inherits the variables but not the pipe, and its descriptor of that number may be a log file or a socket."""
    identity = os.environ.get(_PIPE_VARIABLE)
    found = os.fstat(fd)
    if identity and f"{found.st_dev}:{found.st_ino}" != identity:
        raise ValueError(f"descriptor {fd} is not kcover's pipe")


def progress(step: int) -> None:
    """Report that training reached ``step`` (cheap: one small pipe write)."""
    _send(f"{int(step)}\n")


def checkpointed(step: int) -> None:
    """Report that a complete checkpoint of ``step`` is on disk."""
    _send(f"ckpt {int(step)}\n")


def step_time(compute_seconds: float, step: int | None = None) -> None:
    """Report this rank's compute seconds of ``step`` (default: one more than the last step timed here).

    Every rank must number its steps alike: either all pass ``step`` or none does.
    """
    automatic = sys.modules.get("kcover_autotime")  # kcover's own DDP timer yields to the script's timings
    if automatic is not None:
        automatic.yield_to_sdk()
    number = _steps["timed"] if step is None else int(step)
    _steps["timed"] = number + 1
    seconds = float(compute_seconds)
    if math.isfinite(seconds) and seconds > 0:
        _send(f"time {number} {seconds:.6g}\n")


class timed:  # noqa: N801 - used as a function: ``with kcover.timed(step):``
    """Time the block as the compute part of ``step`` and report it with :func:`step_time`."""

    __slots__ = ("began", "step")

    def __init__(self, step: int | None = None) -> None:
        self.step = step
        self.began = 0.0

    def __enter__(self) -> timed:
        self.began = perf_counter()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        if kind is None:
            step_time(perf_counter() - self.began, self.step)
