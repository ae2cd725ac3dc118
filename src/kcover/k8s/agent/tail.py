"""Following log files with durable offsets: CRI container logs and the kernel log.

The kubelet writes ``<root>/<namespace>_<pod>_<uid>/<container>/<n>.log`` and
rotates by renaming ``0.log`` and starting a new one; :class:`Tailer` notices
a new inode (or a truncated file), first reads what is left of the file it
followed and of any newer renamed ones, compressed or not
(:mod:`kcover.k8s.agent.rotation`), then starts the new file from its
beginning.  A new file given the inode an old one freed is told apart by its
first bytes, kept with the offset.
Only whole lines are returned; a partial last line waits for the next poll,
and so do the pieces of a line the runtime cut whose last piece is not
written yet (:mod:`kcover.collect.partial_lines`).
Offsets (inode, byte offset, line count) are saved atomically to a state file,
so a restarted agent resumes where it stopped and reports nothing twice.

``/dev/kmsg`` is a character device that returns one record per read
(``pri,seq,usec,flags;message``); a regular file in its place (tests, or a
``journalctl -k`` export) is followed like any log.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from kcover.collect.partial_lines import unfinished
from kcover.k8s.agent.rotation import Retry, newest_stamp, unread_renamed

READ_LIMIT = 1 << 20
_POD_DIR = re.compile(r"^(?P<namespace>[^_]+)_(?P<pod>[^_]+)_(?P<uid>[0-9a-fA-F\-]+)$")
_KMSG_PREFIX = re.compile(rb"^\d+,\d+,\d+,[^;]*;", re.MULTILINE)


@dataclass(frozen=True)
class ContainerLog:
    namespace: str
    pod: str
    uid: str
    container: str
    path: Path


HEAD_BYTES = 64
"""Bytes of a file's start kept with its cursor: a CRI line starts with a timestamp, so files differ there."""


ROTATED_READ_LIMIT = 8 << 20
"""Bytes read at once from a rotated file: a gzipped one is decompressed from its start at each read."""


@dataclass
class Cursor:
    """How far one file has been read.

    ``head`` (hex of the first bytes) tells a new file that was given a freed
    inode from the old; ``after``: the stamp of the newest rotated file there
    was when this file was first seen (files rotated later are newer than it).
    """

    inode: int
    offset: int = 0
    lines: int = 0
    head: str = ""
    after: str = ""


def find_container_logs(root: Path) -> Iterator[ContainerLog]:
    """Every current container log under a ``/var/log/pods``-style root."""
    if not root.is_dir():
        return
    for pod_dir in root.iterdir():
        match = _POD_DIR.match(pod_dir.name)
        if not match or not pod_dir.is_dir():
            continue
        for container_dir in pod_dir.iterdir():
            if not container_dir.is_dir():
                continue
            for log in container_dir.glob("*.log"):
                yield ContainerLog(match["namespace"], match["pod"], match["uid"], container_dir.name, log)


def _take_lines(data: bytes, cursor: Cursor, *, final: bool, limit: int = READ_LIMIT) -> tuple[bytes, int] | None:
    """The whole lines of ``data`` (read at the cursor), moving the cursor past them; None when there are none.

    ``limit``: the most that was asked for (less came: the file's end was
    reached).  ``final``: the file is no longer written (rotated away), so a
    last line without its line break is taken too rather than waited for.
    """
    cut = data.rfind(b"\n")
    if cut < 0 or (final and len(data) < limit):
        if not data or (len(data) < limit and not final):
            return None
        cut = len(data) - 1
    block = data[: cut + 1]
    first = cursor.lines + 1
    if cursor.offset == 0:
        cursor.head = block[:HEAD_BYTES].hex()
    cursor.offset += len(block)
    cursor.lines += block.count(b"\n")
    return block, first


def _replaced(path: Path, opened: IO[bytes], inode: int, cursor: Cursor) -> bool:
    """Whether the file a cursor followed is no longer the one at ``path`` (rotated away, or its inode reused).

    ``opened``: that file, just opened (its first bytes are compared with the cursor's).
    """
    if cursor.inode != inode:
        return True
    if cursor.head:
        return opened.read(len(cursor.head) // 2).hex() != cursor.head
    return newest_stamp(path) != cursor.after  # nothing read yet to know it by: a rotation since says so


def _cursor_from(saved: object) -> Cursor | None:
    """A cursor from its saved form; None when damaged.  Keys it does not know (a newer agent's) are ignored."""
    if not isinstance(saved, dict):
        return None
    inode, offset, lines, head, after = (saved.get(name) for name in ("inode", "offset", "lines", "head", "after"))
    if not all(isinstance(number, int) and not isinstance(number, bool) and number >= 0
               for number in (inode, offset, lines)):
        return None
    return Cursor(
        int(inode), int(offset), int(lines),  # type: ignore[arg-type]
        head if isinstance(head, str) else "", after if isinstance(after, str) else "",
    )


class Tailer:
    """New whole lines of many files since the saved offsets."""

    def __init__(self, state_file: Path | None = None) -> None:
        self.state_file = state_file
        self.cursors: dict[str, Cursor] = {}
        self.waiting: dict[str, int] = {}
        """Files whose last read held a cut line's pieces back, and where in the file those begin."""
        if state_file is not None and state_file.exists():
            try:
                saved = json.loads(state_file.read_text())
            except (ValueError, OSError):
                saved = {}
            self.cursors = {
                path: cursor for path, value in (saved.items() if isinstance(saved, dict) else ())
                if (cursor := _cursor_from(value)) is not None
            }

    def read(self, path: Path) -> tuple[bytes, int] | None:
        """New complete lines of ``path`` and the line number of the first; None when nothing new."""
        try:
            info = path.stat()
        except OSError:
            return None
        key = str(path)
        cursor = self.cursors.get(key)
        if cursor is not None and cursor.inode == info.st_ino and info.st_size == cursor.offset:
            return None  # nothing new (checked first: this is most polls of most files)
        try:
            with path.open("rb") as stream:  # one open per poll with news: the first bytes, then the new ones
                if cursor is not None and _replaced(path, stream, info.st_ino, cursor):
                    try:  # a new file: first what is left of the rotated ones (the fault may be there)
                        rotated = self._read_rotated(key, path, cursor)
                    except Retry:
                        return None
                    if rotated is not None:
                        return rotated
                    cursor = None
                if cursor is None or info.st_size < cursor.offset:  # new, or truncated in place
                    cursor = self.cursors[key] = Cursor(inode=info.st_ino, after=newest_stamp(path))
                    self.waiting.pop(key, None)  # a hold in the file before counts no more
                if info.st_size == cursor.offset:
                    return None
                stream.seek(cursor.offset)
                data = stream.read(READ_LIMIT)
        except OSError:
            return None
        return _take_lines(self._held_back(key, data, cursor.offset), cursor, final=False)

    def _held_back(self, key: str, data: bytes, offset: int) -> bytes:
        """``data`` (read at ``offset``) without the pieces of a cut line whose last piece is not written yet.

        Such pieces (:mod:`kcover.collect.partial_lines`) wait one poll, and
        only one: the next read gives them as they are, joined or not
        (containerd writes the last words of a container that died mid-line as
        a piece, and CRI-O a piece for each write without a line break, a
        progress bar's every redraw), and holds only pieces that began after
        them.  A read that is all pieces is given too.
        """
        found = unfinished(data)
        if found is not None and self.waiting.get(key) == offset + found[0]:  # they waited one poll: given
            released = found[0]
            found = unfinished(data, since=released + 1)
            if found is not None and found[1] <= released:  # later pieces interleaved with them: all given
                found = None
        if found is None or (found[1] == 0 and len(data) >= READ_LIMIT):
            self.waiting.pop(key, None)
            return data
        self.waiting[key] = offset + found[0]
        return data[: found[1]]

    def _read_rotated(self, key: str, path: Path, cursor: Cursor) -> tuple[bytes, int] | None:
        """Lines of the files ``path`` was rotated into that were not read yet; None when none are left."""
        files, followed = unread_renamed(path, cursor.inode, cursor.head, cursor.after)
        for at, renamed in enumerate(files):
            reading = cursor if followed and at == 0 else Cursor(inode=renamed.inode)
            data = renamed.read_from(reading.offset, ROTATED_READ_LIMIT)
            lines = _take_lines(data, reading, final=True, limit=ROTATED_READ_LIMIT)
            if lines is not None:  # the cursor changes only once something was read
                reading.inode, reading.after = renamed.inode, renamed.stamp
                self.cursors[key] = reading
                return lines
        return None

    def forget_missing(self) -> None:
        for key in [k for k in self.cursors if not Path(k).exists()]:
            del self.cursors[key]
            self.waiting.pop(key, None)

    def save(self) -> None:
        if self.state_file is None:
            return
        self.state_file.parent.mkdir(parents=True, exist_ok=True)
        partial = self.state_file.with_suffix(".tmp")
        partial.write_text(json.dumps({k: vars(v) for k, v in self.cursors.items()}))
        partial.replace(self.state_file)


class KernelLog:
    """The node's kernel messages from ``/dev/kmsg`` (a device) or a file standing in for it."""

    def __init__(self, path: Path, tailer: Tailer) -> None:
        self.path = path
        self.tailer = tailer
        self.device: int | None = None
        self.status = "a file, followed"
        """What became of the kernel log: read as a device, followed as a file, or why it cannot be read."""
        self._unreadable = False
        try:
            is_device = stat.S_ISCHR(path.stat().st_mode)
        except OSError:
            is_device = False  # a file that may appear later: followed when it does
        if is_device:
            try:
                self.device = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
                os.lseek(self.device, 0, os.SEEK_END)  # new messages only; history was seen before
                self.status = "the device, new messages"
            except OSError as err:
                self._unreadable = True  # never tail a device we may not open as if it were a file
                self.status = f"cannot be read: {err.strerror or err}"

    def read(self) -> bytes:
        if self._unreadable:
            return b""
        if self.device is None:
            found = self.tailer.read(self.path)
            return _KMSG_PREFIX.sub(b"", found[0]) if found else b""
        records = []
        while True:
            try:
                records.append(os.read(self.device, 8192))
            except (BlockingIOError, BrokenPipeError):
                break
            except OSError:
                break
        return _KMSG_PREFIX.sub(b"", b"".join(records))
