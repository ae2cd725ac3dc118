"""Following log files with durable offsets: CRI container logs and the kernel log.

The kubelet writes ``<root>/<namespace>_<pod>_<uid>/<container>/<n>.log`` and
rotates by renaming ``0.log`` and starting a new one; :class:`Tailer` notices
a new inode (or a truncated file) and starts the new file from its beginning.
Only whole lines are returned; a partial last line waits for the next poll.
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


@dataclass
class Cursor:
    inode: int
    offset: int = 0
    lines: int = 0


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


class Tailer:
    """New whole lines of many files since the saved offsets."""

    def __init__(self, state_file: Path | None = None) -> None:
        self.state_file = state_file
        self.cursors: dict[str, Cursor] = {}
        if state_file is not None and state_file.exists():
            try:
                saved = json.loads(state_file.read_text())
                self.cursors = {path: Cursor(**value) for path, value in saved.items()}
            except (ValueError, TypeError):
                self.cursors = {}

    def read(self, path: Path) -> tuple[bytes, int] | None:
        """New complete lines of ``path`` and the line number of the first; None when nothing new."""
        try:
            info = path.stat()
        except OSError:
            return None
        key = str(path)
        cursor = self.cursors.get(key)
        if cursor is None or cursor.inode != info.st_ino or info.st_size < cursor.offset:
            cursor = Cursor(inode=info.st_ino)
            self.cursors[key] = cursor
        if info.st_size == cursor.offset:
            return None
        try:
            with path.open("rb") as stream:
                stream.seek(cursor.offset)
                data = stream.read(READ_LIMIT)
        except OSError:
            return None
        cut = data.rfind(b"\n")
        if cut < 0:
            if len(data) < READ_LIMIT:
                return None
            cut = len(data) - 1
        block = data[: cut + 1]
        first = cursor.lines + 1
        cursor.offset += len(block)
        cursor.lines += block.count(b"\n")
        return block, first

    def forget_missing(self) -> None:
        for key in [k for k in self.cursors if not Path(k).exists()]:
            del self.cursors[key]

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
