"""The files the kubelet rotates a container log into, and which of them to read next.

When ``0.log`` outgrows ``containerLogMaxSize`` the kubelet compresses the file
it renamed at the last rotation (``0.log.<YYYYMMDD-hhmmss>`` becomes
``….gz``), removes the oldest beyond ``containerLogMaxFiles``, renames ``0.log``
to ``0.log.<timestamp>`` (left uncompressed "so that readers can finish it")
and has the runtime open a new ``0.log``.  A follower that was slow, or down
for a while, finds the file it followed renamed, perhaps compressed or
deleted, and newer files after it.  :func:`unread_renamed` says what to read:
what is left of the file followed (found by inode and first bytes, or by its
first bytes once compressed), then each newer renamed file from its start,
oldest first, as ``kubectl logs`` reads them.  Newer means a later stamp than
the newest one there was when the file followed was first seen, so a file
followed that was deleted loses only itself.  A file cut short or damaged is
read up to the damage and then left behind.
"""

from __future__ import annotations

import gzip
import io
import stat
import zlib
from dataclasses import dataclass
from pathlib import Path

from kcover.collect.sources import ROTATED_SUFFIX


class Retry(Exception):  # noqa: N818 - not an error: a file vanished between listing and opening
    """A renamed file went away while being looked at (the kubelet compressing it): look again at the next poll."""


@dataclass(frozen=True)
class Renamed:
    """One file a log was rotated into: its inode, its stamp, and whether gzipped."""

    path: Path
    inode: int
    stamp: str
    compressed: bool

    def _open(self) -> io.BufferedIOBase:
        return gzip.GzipFile(self.path, "rb") if self.compressed else self.path.open("rb")

    def read_from(self, offset: int, limit: int) -> bytes:
        """Up to ``limit`` bytes of text from ``offset``; ``b""`` at its end or where it is damaged.

        Raises :class:`Retry` when the file is gone (renamed to ``.gz`` since listed).
        """
        try:
            opened = self._open()
        except FileNotFoundError:
            raise Retry from None
        except OSError:
            return b""
        gathered = bytearray()
        with opened:
            try:
                opened.seek(offset)  # a gzip stream seeks forward by decompressing
                while len(gathered) < limit and (step := opened.read1(min(1 << 20, limit - len(gathered)))):
                    gathered += step  # read1: one step each, so a damaged gzip's text before the damage is kept
            except (OSError, EOFError, zlib.error):
                pass  # cut short or damaged: what came before it counts
        return bytes(gathered)

    def starts_with(self, head: str) -> bool:
        """Whether the file's text begins with ``head`` (hex); raises :class:`Retry` when the file is gone."""
        return self.read_from(0, len(head) // 2).hex() == head


def renamed_logs(log: Path) -> list[Renamed]:
    """The regular files ``log`` was rotated into, oldest first; one mid-compression (both there) read uncompressed."""
    try:
        siblings = sorted(log.parent.iterdir())
    except OSError:
        return []
    by_stamp: dict[str, Renamed] = {}
    for sibling in siblings:
        match = ROTATED_SUFFIX.fullmatch(sibling.name, len(log.name)) if sibling.name.startswith(log.name) else None
        if not match:
            continue
        try:
            info = sibling.lstat()
        except OSError:
            continue
        compressed = match["gz"] is not None
        if not stat.S_ISREG(info.st_mode) or (compressed and match["stamp"] in by_stamp):
            continue
        by_stamp[match["stamp"]] = Renamed(sibling, info.st_ino, match["stamp"], compressed)
    return [by_stamp[stamp] for stamp in sorted(by_stamp)]


NO_STAMP = "00000000-000000"
"""The stamp before every stamp: no file had been rotated yet."""


def newest_stamp(log: Path) -> str:
    """The stamp of the newest file ``log`` was rotated into (:data:`NO_STAMP`: none): later ones are its future."""
    renamed = renamed_logs(log)
    return renamed[-1].stamp if renamed else NO_STAMP


def _followed(renamed: list[Renamed], inode: int, head: str) -> int | None:
    """Where the file followed is among the renamed files: same inode and first bytes, or its first bytes gzipped."""
    for at, candidate in enumerate(renamed):
        same_inode = candidate.inode == inode
        if (same_inode or (candidate.compressed and head)) and candidate.starts_with(head):
            return at
    return None


def unread_renamed(log: Path, inode: int, head: str, after: str) -> tuple[list[Renamed], bool]:
    """The renamed files to read, oldest first, and whether the first is the file followed (read on from its offset).

    ``after``: the newest stamp there was when the file followed was first
    seen (``""`` for a cursor saved by an older agent: then only the newest
    renamed file is taken, as it did).  Raises :class:`Retry` when a file
    vanished while being looked at.
    """
    renamed = renamed_logs(log)
    at = _followed(renamed, inode, head)
    if at is not None:
        return renamed[at:], True
    if not after:
        return renamed[-1:], False
    return [candidate for candidate in renamed if candidate.stamp > after], False
