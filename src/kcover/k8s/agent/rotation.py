"""The files the kubelet rotates a container log into, and which of them to read next.

When ``0.log`` outgrows ``containerLogMaxSize`` the kubelet compresses the file
it renamed at the last rotation (``0.log.<YYYYMMDD-hhmmss>`` becomes
``….gz``), renames ``0.log`` to ``0.log.<timestamp>`` (left uncompressed "so
that readers can finish it") and has the runtime open a new ``0.log``; it keeps
``containerLogMaxFiles`` files in all.  A follower that was slow, or down for a
while, finds the file it followed renamed, perhaps compressed, and newer files
after it.  :func:`next_renamed` says which to read: what is left of the file
followed (found by inode and first bytes, or by its first bytes once
compressed), then each newer renamed file from its start, oldest first, as
``kubectl logs`` reads them; only a file already deleted is lost.
"""

from __future__ import annotations

import gzip
import os
import re
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import IO, cast

_STAMP = re.compile(r"(?P<stamp>\d{8}-\d{6})(?P<gz>\.gz)?")
"""The suffix the kubelet gives a rotated log (Go's ``20060102-150405``), and ``.gz`` once compressed."""


@dataclass(frozen=True)
class Renamed:
    """One file a log was rotated into: its inode, whether gzipped, and the bytes of text it holds."""

    path: Path
    inode: int
    compressed: bool
    size: int

    def open(self) -> IO[bytes]:
        """The file's text, decompressed when gzipped (a gzip stream seeks forward by decompressing)."""
        return cast(IO[bytes], gzip.open(self.path, "rb")) if self.compressed else self.path.open("rb")


def starts_with(opened: IO[bytes], head: str) -> bool:
    """Whether a file's first bytes are ``head`` (hex; no head kept: assumed so)."""
    if not head:
        return True
    try:
        return opened.read(len(head) // 2).hex() == head
    except (OSError, EOFError, zlib.error):
        return False


def _text_size(path: Path, info: os.stat_result, compressed: bool) -> int:
    """Bytes of text in a renamed file: its size, or a gzip's recorded length (ISIZE, the last 4 bytes)."""
    if not compressed:
        return info.st_size
    try:
        with path.open("rb") as raw:
            raw.seek(max(0, info.st_size - 4))
            return int.from_bytes(raw.read(4), "little")
    except OSError:
        return 0


def renamed_logs(log: Path) -> list[Renamed]:
    """The files ``log`` was rotated into, oldest first; a file both compressed and not (mid-compression) once."""
    try:
        siblings = sorted(log.parent.iterdir())
    except OSError:
        return []
    by_stamp: dict[str, Renamed] = {}
    for sibling in siblings:
        suffix = sibling.name[len(log.name) + 1:] if sibling.name.startswith(log.name + ".") else ""
        match = _STAMP.fullmatch(suffix)
        if not match:
            continue
        try:
            info = sibling.stat()
        except OSError:
            continue
        compressed = match["gz"] is not None
        if compressed and match["stamp"] in by_stamp:
            continue  # the uncompressed one is still there: read it
        by_stamp[match["stamp"]] = Renamed(sibling, info.st_ino, compressed, _text_size(sibling, info, compressed))
    return [by_stamp[stamp] for stamp in sorted(by_stamp)]


def _is_followed(renamed: Renamed, inode: int, head: str) -> bool:
    """Whether ``renamed`` is the file followed: its inode and first bytes, or (compressed since) its first bytes."""
    if renamed.inode != inode and not (renamed.compressed and head):
        return False
    try:
        with renamed.open() as opened:
            return starts_with(opened, head)
    except OSError:
        return False


def next_renamed(log: Path, inode: int, head: str, offset: int) -> tuple[Renamed, bool] | None:
    """The renamed file to read next, and True when it is the file followed (read on from ``offset``).

    False: a newer renamed file, read from its start.  None: nothing renamed
    is left unread, so the new ``log`` is next.  A file followed that cannot
    be found (deleted, or no first bytes kept by an older agent) leaves only
    the newest renamed file, which came after it.
    """
    renamed = renamed_logs(log)
    followed = next((at for at, candidate in enumerate(renamed) if _is_followed(candidate, inode, head)), None)
    if followed is not None and renamed[followed].size > offset:
        return renamed[followed], True
    later = renamed[followed + 1:] if followed is not None else renamed[-1:]
    return next(((candidate, False) for candidate in later if candidate.size > 0), None)
