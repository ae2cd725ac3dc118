"""The pid written into a held ``flock`` file, so that whoever is refused can name the holder.

Two places lock a file for as long as a process works on something: ``kcover
run`` its state dir (``kcover.lock``) and a checkpoint writer its rank
(``.rank-<R>.lock``).  The lock itself is the kernel's and dies with its
holder; the pid inside is only for the refusal message, so writing it may fail
(a full disk) and reading it may find nothing yet.
"""

from __future__ import annotations

import contextlib
import os


def write_holder(fd: int) -> None:
    """Write this process's pid into the held lock file (best effort)."""
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)


def read_holder(fd: int) -> int | None:
    """The pid the holder wrote, or None when it has not written one (yet)."""
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None
