"""The state dir of ``kcover run``: one run at a time in it, and a folder of its own for each run.

Two runs sharing a state dir used to interleave their lines in the same
``attempt-1/rank0.log``, and a later run appended to an earlier run's logs, so
the line numbers of its evidence pointed at the wrong lines.  :func:`claim`
therefore takes an exclusive ``flock`` on ``<state dir>/kcover.lock``: an OS
lock, held by an open file descriptor (close-on-exec, so workers never inherit
it) and released by the kernel when the process ends, even by SIGKILL, so it is
never stale.  The holder writes its pid into the file so that a second run can
name it.  Each run then gets ``<state dir>/runs/<UTC time>-<pid>/`` for its
``attempt-N/rankR.log``; the history database stays at ``<state dir>/kcover.db``
and its evidence names these files.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from kcover.checkpoint.files import open_regular
from kcover.launcher.spec import SpecError
from kcover.lockfile import read_holder, write_holder

LOCK_NAME = "kcover.lock"
RUNS_NAME = "runs"
MAX_NAME_TRIES = 1000


class StateDirBusyError(SpecError):
    """Another live ``kcover run`` holds the state dir; the message names the dir and its pid."""


@dataclass
class StateDirClaim:
    """A held state dir: the lock's descriptor and this run's own folder."""

    root: Path
    run_dir: Path
    lock_fd: int

    def release(self) -> None:
        """Drop the lock (also dropped by the kernel if the process dies first); idempotent."""
        if self.lock_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.lock_fd)
            self.lock_fd = -1


def claim(state_dir: Path) -> StateDirClaim:
    """Lock ``state_dir`` for this process and make this run's folder; :class:`SpecError` when impossible."""
    lock_fd = _open_lock(state_dir)
    try:
        _lock(lock_fd, state_dir)
        write_holder(lock_fd)
        run_dir = _new_run_dir(state_dir)
    except BaseException:
        os.close(lock_fd)
        raise
    return StateDirClaim(state_dir, run_dir, lock_fd)


def ensure_free(state_dir: Path) -> None:
    """:class:`StateDirBusyError` when a live run holds ``state_dir`` (checked, not kept: the run claims it later)."""
    if state_dir.is_dir():
        lock_fd = _open_lock(state_dir)
        try:
            _lock(lock_fd, state_dir)
        finally:
            os.close(lock_fd)


def wipe(state_dir: Path) -> None:
    """Empty ``state_dir`` for a fresh start (``kcover demo``); :class:`SpecError` while a run holds it."""
    if not state_dir.exists():
        return
    lock_fd = _open_lock(state_dir)
    try:
        _lock(lock_fd, state_dir)
        for entry in state_dir.iterdir():
            if entry.name == LOCK_NAME:
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
    finally:
        os.close(lock_fd)


def _open_lock(state_dir: Path) -> int:
    path = state_dir / LOCK_NAME
    try:
        return open_regular(path, os.O_RDWR | os.O_CREAT)
    except OSError as exc:
        raise SpecError(f"state dir {state_dir}: cannot open the lock file {path}: {exc.strerror or exc}") from None


def _lock(lock_fd: int, state_dir: Path) -> None:
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise StateDirBusyError(
            f"state dir {state_dir} is in use by another kcover run ({read_holder(lock_fd) or 'pid unknown'}); "
            "wait for it to end or give this run another --state-dir"
        ) from None
    except OSError as exc:
        raise SpecError(f"state dir {state_dir} cannot be locked: {exc.strerror or exc}") from None


def _new_run_dir(state_dir: Path) -> Path:
    runs = state_dir / RUNS_NAME
    name = f"{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{os.getpid()}"
    try:
        runs.mkdir(exist_ok=True)
        for attempt in range(MAX_NAME_TRIES):
            folder = runs / (name if attempt == 0 else f"{name}.{attempt}")
            with contextlib.suppress(FileExistsError):
                folder.mkdir()
                return folder
    except OSError as exc:
        raise SpecError(f"state dir {state_dir} is not writable: cannot make {runs}: {exc.strerror or exc}") from None
    raise SpecError(f"state dir {state_dir}: no free run folder name under {runs}")
