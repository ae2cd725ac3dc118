"""Who holds a ``flock`` file, written into it, so that whoever is refused can name the holder.

Two places lock a file for as long as a process works on something: ``kcover
run`` its state dir (``kcover.lock``) and a checkpoint writer its rank
(``.rank-<R>.lock``).  The lock itself is the kernel's and dies with its
holder; what is written inside is only for the refusal message, so writing it
may fail (a full disk) and reading it may find nothing yet.

A pid alone names no process once the file is shared: pods on other nodes (a
shared volume) and containers in their own pid namespaces all run their trainer
as a small pid, often 1.  So the holder writes its pid, its host name and its
pid namespace (``/proc/self/ns/pid``), and a refusal says "pid 1 on
trainer-worker-3"; a reader takes the holder for its own process only when all
three agree.  A file from an older kcover holds the pid alone.
"""

from __future__ import annotations

import contextlib
import os
import socket
from dataclasses import dataclass


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return "?"


@dataclass(frozen=True)
class Holder:
    """The process that wrote a lock file: pid, host and pid namespace (None: not written)."""

    pid: int
    host: str | None = None
    namespace: str | None = None

    def __str__(self) -> str:
        return f"pid {self.pid}" + (f" on {self.host}" if self.host else "")

    @property
    def is_this_process(self) -> bool:
        if self.pid != os.getpid():
            return False
        return self.host is None or (self.host == socket.gethostname() and self.namespace == _pid_namespace())


def write_holder(fd: int) -> None:
    """Write this process's pid, host and pid namespace into the held lock file (best effort)."""
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {socket.gethostname()} {_pid_namespace()}\n".encode(), 0)


def read_holder(fd: int) -> Holder | None:
    """Who holds the lock, or None when the holder has not written itself (yet)."""
    try:
        fields = os.pread(fd, 512, 0).decode("utf-8", "replace").split()
    except OSError:
        return None
    if not fields or not fields[0].isdigit():
        return None
    shown = [field if field.isprintable() else None for field in fields[1:3]]  # no escape codes in a message
    host, namespace = [*shown, None, None][:2]
    return Holder(int(fields[0]), host, namespace)
