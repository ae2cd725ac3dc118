"""kcover's on-disk cache of work that depends only on its inputs: compiled catalogs.

Loading the catalog means validating some 500 regular expressions (compiling
each, proving each linear-time) and compiling them into a Hyperscan database;
together that is most of the start-up time of ``kcover explain``.  The
results depend only on the catalog text and on kcover's own code, so they are
kept under ``$XDG_CACHE_HOME/kcover`` (``~/.cache/kcover``) in files named by
a digest of everything they depend on: a changed input simply finds no file.
A missing, damaged or unwritable cache only costs the work it would have
saved; nothing is ever read from it that its key does not name.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from pathlib import Path


def cache_dir() -> Path:
    """Where kcover keeps its cached files."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kcover"


def read_cached(name: str) -> bytes | None:
    """The bytes cached as ``name``, or None when there are none (or they are not a regular file, or unreadable)."""
    try:
        fd = os.open(cache_dir() / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO or a device there would hang or flood the read
            return None
        with os.fdopen(os.dup(fd), "rb") as file:
            return file.read()
    except OSError:
        return None
    finally:
        os.close(fd)


def write_cached(name: str, data: bytes) -> None:
    """Cache ``data`` as ``name``, atomically (a reader never sees half a file); errors are ignored."""
    target = cache_dir() / name
    partial = target.with_suffix(f".{secrets.token_hex(8)}.tmp")  # not the pid: containers share pids
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        partial.write_bytes(data)
        partial.replace(target)
    except OSError:
        with contextlib.suppress(OSError):
            partial.unlink(missing_ok=True)  # a full disk leaves no half-written file behind
