"""Opening files in folders that others can write to: regular files only, never through a symlink, bounded.

A checkpoint dir and the shared-memory folder are shared — by ranks, by
restarts, by people copying things around — so a name may hold anything: a
FIFO (opening it would block for ever), a symlink to ``/dev/zero`` (reading it
never ends) or to someone's file (writing through it destroys that file), a
directory.  Every file of ours is opened here with ``O_NOFOLLOW`` and
``O_NONBLOCK`` and accepted only if ``fstat`` says it is a regular file; small
files are read only up to a bound.  Anything else raises
:class:`NotRegularFileError`, an :class:`OSError`, so callers skip it with a
warning exactly as they skip a missing file.  Used by
:mod:`~kcover.checkpoint.disk`, :mod:`~kcover.checkpoint.snapshot`,
:mod:`~kcover.checkpoint.restore`, :mod:`~kcover.checkpoint.lock` and the
Checkpointer.  :func:`exchange` swaps two names atomically.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import stat
from pathlib import Path
from typing import Any

_KINDS = {stat.S_IFDIR: "a directory", stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device",
          stat.S_IFBLK: "a block device", stat.S_IFSOCK: "a socket"}


class NotRegularFileError(OSError):
    """A name of ours holds something other than a regular file (the message says what)."""

    def __init__(self, path: str | os.PathLike[str], what: str) -> None:
        super().__init__(errno.EINVAL, f"not a regular file ({what})", str(path))


def open_regular(path: str | os.PathLike[str], flags: int = os.O_RDONLY, mode: int = 0o644) -> int:
    """``os.open`` that refuses symlinks, does not block on a FIFO and returns only a regular file's fd."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise NotRegularFileError(path, "a symbolic link") from None
        if exc.errno in (errno.EISDIR, errno.ENXIO):  # a dir opened for writing; a FIFO without a reader
            raise NotRegularFileError(path, "a directory" if exc.errno == errno.EISDIR else "a FIFO") from None
        raise
    kind = stat.S_IFMT(os.fstat(fd).st_mode)
    if kind != stat.S_IFREG:
        os.close(fd)
        raise NotRegularFileError(path, _KINDS.get(kind, "not a file"))
    os.set_blocking(fd, True)
    return fd


def read_small(path: str | os.PathLike[str], limit: int) -> bytes:
    """The whole of a regular file of at most ``limit`` bytes (raises OSError otherwise)."""
    fd = open_regular(path)
    try:
        if os.fstat(fd).st_size > limit:
            raise OSError(errno.EFBIG, f"larger than {limit} bytes", str(path))
        chunks, size = [], 0
        while chunk := os.read(fd, limit + 1 - size):
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                raise OSError(errno.EFBIG, f"larger than {limit} bytes", str(path))
        return b"".join(chunks)
    finally:
        os.close(fd)


def regular_size(path: Path) -> int | None:
    """The size of ``path`` if it is itself (not through a symlink) a regular file, else None."""
    try:
        status = path.lstat()
    except OSError:
        return None
    return status.st_size if stat.S_ISREG(status.st_mode) else None


_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
_UNSUPPORTED = (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP)


@functools.cache
def _renameat2() -> Any:
    """The C library's ``renameat2``, looked up once (None where it has none)."""
    return getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)


def exchange(first: Path, second: Path) -> bool:
    """Swap the files at two names in one step (``renameat2(RENAME_EXCHANGE)``); False where not supported.

    Neither name is ever missing in between, and a symlink is swapped as a name, never followed.  Raises
    OSError when either name is missing (or for any other failure than lack of support).
    """
    function = _renameat2()
    if function is None:  # a C library older than glibc 2.28
        return False
    if function(_AT_FDCWD, os.fsencode(first), _AT_FDCWD, os.fsencode(second), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in _UNSUPPORTED:  # a file system without it (the kernel checks flags before names)
        return False
    raise OSError(code, os.strerror(code), str(first), None, str(second))
