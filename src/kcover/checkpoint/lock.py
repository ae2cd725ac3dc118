"""One writer per checkpoint dir and rank: an OS lock that dies with its holder.

Any number of Checkpointers may read a rank's checkpoints (an evaluation
process calling ``load_latest()``, a restarted worker), but only one may write
them: two writers delete each other's temporary files and shared-memory
buffers.  The writer holds an exclusive ``flock`` on
``<dir>/.rank-<R>.lock``, taken by its first ``save`` or ``reserve``; a second
writer — another process, or another Checkpointer in this process (each opens
its own file description) — gets :class:`CheckpointInUseError` naming the
holder (pid and host: :mod:`kcover.lockfile`).  The kernel drops the lock when the holder exits, SIGKILL
included, so a dead writer never blocks the next one; the descriptor is
close-on-exec and closed in forked children (DataLoader workers), so no child
keeps a dead writer's lock alive.

A Checkpointer that is not writing takes the lock only for a moment, to remove
the leftovers of a dead writer (:meth:`WriterLock.try_acquire`), which is why a
new writer waits up to :data:`ACQUIRE_SECONDS` before giving up.  Where no lock
can be taken at all (a read-only dir, a file system without locks) the writer
goes on unlocked, with a warning: its writes fail or succeed as before.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import time
import weakref
from pathlib import Path

from kcover.checkpoint.errors import CheckpointInUseError
from kcover.checkpoint.files import open_regular
from kcover.lockfile import Holder, read_holder, write_holder

log = logging.getLogger("kcover.checkpoint")
ACQUIRE_SECONDS = 3.0
_held: weakref.WeakSet[WriterLock] = weakref.WeakSet()


class WriterLock:
    """The writer lock of one dir and rank (see the module docstring)."""

    def __init__(self, directory: Path, rank: int) -> None:
        self.directory, self.rank = directory, rank
        self.path = directory / f".rank-{rank:05d}.lock"
        self._fd = -1
        self.unlocked = False  # True: writing without a lock, because none could be taken here

    @property
    def held(self) -> bool:
        return self._fd >= 0

    def try_acquire(self) -> bool:
        """Take the lock if it is free right now; False when held elsewhere or impossible here."""
        if self.held:
            return True
        fd = self._open(warn=False)
        if fd < 0:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        self._keep(fd)
        return True

    def acquire(self) -> None:
        """Take the lock for writing; raises :class:`CheckpointInUseError` while another writer holds it."""
        if self.held or self.unlocked:
            return
        fd = self._open(warn=True)
        if fd < 0:
            self.unlocked = True
            return
        deadline = time.monotonic() + ACQUIRE_SECONDS
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() < deadline:  # perhaps a reader removing a dead writer's leftovers
                    time.sleep(0.02)
                    continue
                holder = read_holder(fd)
                os.close(fd)
                raise self._in_use(holder) from None
            except OSError as exc:
                os.close(fd)
                self._warn_unlocked(exc)
                self.unlocked = True
                return
        self._keep(fd)
        write_holder(fd)

    def release(self) -> None:
        """Let the lock go (the kernel does it anyway when the process ends); idempotent."""
        _held.discard(self)
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1

    def _keep(self, fd: int) -> None:
        self._fd = fd
        _held.add(self)

    def _open(self, warn: bool) -> int:
        """The lock file's descriptor, or -1 when it cannot be opened here."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            return open_regular(self.path, os.O_RDWR | os.O_CREAT)
        except OSError as exc:
            if warn:
                self._warn_unlocked(exc)
            return -1

    def _warn_unlocked(self, exc: OSError) -> None:
        if not self.unlocked:
            log.warning("kcover checkpoint: cannot lock %s: %s; a second writer of rank %d would not be noticed",
                        self.path, exc.strerror or exc, self.rank)

    def _in_use(self, holder: Holder | None) -> CheckpointInUseError:
        who = "another process" if holder is None else f"the process {holder}"
        if holder is not None and holder.is_this_process:
            who = f"another Checkpointer in this process ({holder})"
        return CheckpointInUseError(
            f"{who} is already writing rank {self.rank}'s checkpoints to {self.directory} (it holds {self.path}); "
            "two writers would destroy each other's files: stop it, or give this one another dir or rank"
        )


def _close_in_child() -> None:
    """A forked child closes its copies of held locks' descriptors; the parent keeps its locks."""
    for lock in list(_held):
        lock.release()


os.register_at_fork(after_in_child=_close_in_child)
