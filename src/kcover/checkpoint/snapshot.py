"""The host buffer that holds the newest snapshot, and the copy into it.

A :class:`SnapshotBuffer` is a file in ``/dev/shm`` mapped into the worker, so
the snapshot outlives the process: a restarted worker on the same machine maps
the same file and restores without reading the disk.  Private memory is used
when shared memory is unavailable or full (no instant restore then).

Space for a new file is reserved with ``posix_fallocate`` — writing into a
tmpfs mapping that cannot get a page would kill the process with SIGBUS; a
reservation fails cleanly with ENOSPC — and the file is written under a
temporary name and renamed over the old one only once its snapshot is
committed, so at every instant the canonical name holds a complete snapshot or
none.  Each commit stamps the file's modification time (the node agent deletes
snapshots no job saved for long); a file deleted under a live writer is not
reused: the next snapshot goes to a new one (so is one whose rename into place
failed).  Only the writer (the holder of :mod:`~kcover.checkpoint.lock`)
removes a leftover ``.next`` file; a reader never touches the writer's files.
Files are opened only as regular files, never through a symlink
(:mod:`~kcover.checkpoint.files`).  A file is reused in place for the
next snapshot (one buffer: peak extra memory is one state size) except while
tensors restored from it — copy-on-write views of the file — are still alive:
then the next snapshot goes to a new file (:meth:`SnapshotBuffer.freeze`).

When CUDA is present the mapping is registered as pinned memory, so
device→host copies run asynchronously at full bus speed and are awaited once.
:func:`write_snapshot` is the only part of a save that blocks training (with an
optimizer to overlap with, only its small tensors; see ``Checkpointer.save``).
Called by :class:`~kcover.checkpoint.checkpointer.Checkpointer`.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import mmap
import os
import struct
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from kcover.checkpoint.errors import CheckpointWriteError
from kcover.checkpoint.files import open_regular, regular_size
from kcover.checkpoint.image import COMMITTED, HEADER_SIZE, WRITING, Header, Plan, pack_header, read_header

log = logging.getLogger("kcover.checkpoint")

_STATE_OFFSET = 12  # the state field: written alone, first on begin and last on commit


class Region:
    """One mapped snapshot file (or private memory): its bytes as a uint8 tensor and a memoryview."""

    def __init__(self, size: int, path: Path | None = None, create: bool = False) -> None:
        self.path, self.size, self._map = path, size, None
        self._pinned = False
        self.inode = 0
        if path is None:
            self.tensor = torch.empty(size, dtype=torch.uint8, pin_memory=torch.cuda.is_available())
            return
        fd = open_regular(path, os.O_RDWR | (os.O_CREAT | os.O_TRUNC if create else 0), 0o600)
        try:
            if create:
                try:
                    os.posix_fallocate(fd, 0, size)
                except OSError as exc:
                    if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                        raise
                    os.ftruncate(fd, size)
            self._map = mmap.mmap(fd, size, flags=mmap.MAP_SHARED)
            self.inode = os.fstat(fd).st_ino
        finally:
            os.close(fd)
        self.tensor = torch.frombuffer(self._map, dtype=torch.uint8)
        if torch.cuda.is_available():
            result = torch.cuda.cudart().cudaHostRegister(self.tensor.data_ptr(), size, 0)  # type: ignore[no-untyped-call]
            self._pinned = int(result) == 0

    def view(self) -> memoryview:
        return memoryview(self._map) if self._map is not None else self.tensor.numpy().data

    def close(self) -> None:
        if self._pinned:
            torch.cuda.cudart().cudaHostUnregister(self.tensor.data_ptr())  # type: ignore[no-untyped-call]
            self._pinned = False
        self.tensor = torch.empty(0, dtype=torch.uint8)
        if self._map is not None:
            with contextlib.suppress(BufferError):  # a view is still alive: the mapping goes with it
                self._map.close()
            self._map = None


class SnapshotBuffer:
    """The committed snapshot (``current``) and, while one is being made, the buffer it goes into."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.current: Region | None = None
        self._next: Region | None = None
        self._views: weakref.ref[mmap.mmap] | None = None
        size = regular_size(path) if path is not None else None
        if path is not None and size is not None and size >= HEADER_SIZE:
            with contextlib.suppress(OSError, ValueError):
                self.current = Region(size, path)

    @property
    def _next_path(self) -> Path:
        assert self.path is not None
        return self.path.with_name(self.path.name + ".next")

    @property
    def shared(self) -> bool:
        return self.path is not None

    @property
    def size(self) -> int:
        return self.current.size if self.current is not None else 0

    def view(self) -> memoryview:
        """The committed snapshot's bytes (empty when there is none)."""
        return self.current.view() if self.current is not None else memoryview(b"")

    def header(self) -> Header | None:
        return read_header(self.view()[:HEADER_SIZE]) if self.size >= HEADER_SIZE else None

    def discard_leftover(self) -> None:
        """As the new writer: remove a ``.next`` buffer left by a writer killed before it committed."""
        if self.path is not None and self._next is None:
            with contextlib.suppress(FileNotFoundError):
                self._next_path.unlink()

    def freeze(self, views: mmap.mmap) -> None:
        """Do not write into the current file while ``views`` (a mapping restored tensors use) is alive."""
        self._views = weakref.ref(views)

    def prepare(self, size: int) -> Region:
        """A buffer of at least ``size`` bytes to write the next snapshot into (raises CheckpointWriteError)."""
        current = self.current
        in_use = self._views is not None and self._views() is not None
        if current is not None and not in_use and self._named(current) \
                and size <= current.size <= max(2 * size, size + (64 << 20)):
            return current
        if self._next is not None and size <= self._next.size <= max(2 * size, size + (64 << 20)):
            return self._next
        if self._next is not None:
            self._next.close()
            self._next = None
        if self.path is None:
            self._next = Region(size)
            return self._next
        try:
            self._next = Region(size, self._next_path, create=True)
        except OSError as exc:
            with contextlib.suppress(OSError):
                self._next_path.unlink()
            raise CheckpointWriteError(
                f"cannot reserve {size} bytes of shared memory at {self._next_path}: {exc.strerror or exc}"
            ) from None
        return self._next

    def _named(self, region: Region) -> bool:
        """Is ``region`` still the file at the canonical name (not deleted by the node agent's sweep)?"""
        if region.path is None:
            return True
        try:
            return region.path.lstat().st_ino == region.inode
        except OSError:
            return False

    def publish(self, region: Region) -> None:
        """``region`` now holds a committed snapshot: make it the current one (atomically, by rename)."""
        if region is self.current:
            return
        if region.path is not None and self.path is not None:
            try:
                os.replace(region.path, self.path)
            except OSError as exc:  # its file was deleted (by hand, by a sweep): the next snapshot gets a new one
                log.warning("kcover checkpoint: cannot put the snapshot in place at %s: %s; it stays in this "
                            "process only", self.path, exc.strerror or exc)
                region.inode = 0
            region.path = self.path
        if self.current is not None:
            self.current.close()
        self.current, self._next, self._views = region, None, None

    def touch(self) -> None:
        """Stamp the committed snapshot file with now: the node agent frees files no job saved for long."""
        if self.path is not None and self.current is not None:
            with contextlib.suppress(OSError):
                os.utime(self.path)

    def use_private(self) -> None:
        """Give up shared memory for this process (it was full or missing)."""
        if self._next is not None:
            self._next.close()
            self._next = None
        self.path = None

    def close(self, remove: bool = False) -> None:
        """Unmap; the committed snapshot file stays (for a restarted worker) unless ``remove``."""
        for region in (self.current, self._next):
            if region is not None:
                region.close()
        ours = self._next is not None  # a .next file this process made (a reader never makes one)
        self.current = self._next = None
        if self.path is not None:
            for path in [self._next_path] * ours + [self.path] * remove:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
        self.path = None


def _copy_tensor(destination: torch.Tensor, tensor: torch.Tensor) -> None:
    source = tensor.detach()
    if not source.is_contiguous():
        source = source.contiguous()
    raw = source.reshape(-1).view(torch.uint8)
    destination.copy_(raw, non_blocking=raw.is_cuda)


def write_snapshot(region: Region, plan: Plan, tensors: Sequence[torch.Tensor], header: Header) -> None:
    """Copy ``tensors`` into ``region`` per ``plan``; the header says COMMITTED only once every byte is there."""
    begin_snapshot(region, header)
    commit_snapshot(region, plan, copy_tensors(region, plan, tensors))


def begin_snapshot(region: Region, header: Header) -> None:
    """Mark ``region`` as being written (a reader never takes it for a complete snapshot)."""
    view = region.view()
    struct.pack_into("<I", view, _STATE_OFFSET, WRITING)
    view[:HEADER_SIZE] = pack_header(Header(WRITING, *_fields(header))).ljust(HEADER_SIZE, b"\0")


def copy_tensors(region: Region, plan: Plan, tensors: Sequence[torch.Tensor],
                 which: Callable[[int], bool] = lambda nbytes: True) -> set[torch.device]:
    """Copy the tensors whose size ``which`` accepts; returns the CUDA devices with copies in flight."""
    devices = set()
    for entry, tensor in zip(plan.entries, tensors, strict=True):
        if not which(entry.nbytes):
            continue
        if entry.nbytes:
            _copy_tensor(region.tensor[entry.offset : entry.offset + entry.nbytes], tensor)
        if tensor.is_cuda:
            devices.add(tensor.device)
    return devices


def commit_snapshot(region: Region, plan: Plan, devices: set[torch.device]) -> None:
    """Write the metadata, wait for device copies, then flip the header to COMMITTED."""
    view = region.view()
    view[plan.meta_offset : plan.total] = plan.meta
    for device in devices:
        torch.cuda.synchronize(device)
    struct.pack_into("<I", view, _STATE_OFFSET, COMMITTED)


def _fields(header: Header) -> tuple[int, int, int, int, int, int, int]:
    h = header
    return h.step, h.generation, h.total, h.meta_offset, h.meta_length, h.rank, h.world_size
