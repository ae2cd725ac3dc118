"""The host buffer that holds the newest snapshot, and the copy into it.

A :class:`SnapshotBuffer` is a file in ``/dev/shm`` mapped into the worker, so
the snapshot outlives the process: a restarted worker on the same machine maps
the same file and restores without reading the disk.  Private memory is used
when shared memory is unavailable or full (no instant restore then).

Space for a new file is reserved with ``posix_fallocate`` — writing into a
tmpfs mapping that cannot get a page would kill the process with SIGBUS; a
reservation fails cleanly with ENOSPC — and the file is written under a
temporary name (``<name>.next``) and put in place only once its snapshot is
committed, so at every instant the canonical name holds a complete snapshot or
none.  The two names are swapped (``renameat2(RENAME_EXCHANGE)``), so the
``.next`` file keeps the previous snapshot, and the next one is written there:
a worker killed in the middle of a snapshot still leaves its last one whole,
and ranks that die one step apart still share a step in memory (two files of a
state's size; ``keep_previous=False`` writes in place into one, as private
memory always does).  Each commit stamps the file's modification time (the node agent deletes
snapshots no job saved for long); a file deleted under a live writer is not
reused: the next snapshot goes to a new one (so is one whose rename into place
failed).  Only the writer (the holder of :mod:`~kcover.checkpoint.lock`)
removes a ``.next`` file a killed writer left half-written; a reader never
touches the writer's files.
Files are opened only as regular files, never through a symlink
(:mod:`~kcover.checkpoint.files`).  A file is reused for a later
snapshot except while tensors restored from it — copy-on-write views of the
file — are still alive: then that snapshot goes to a new file
(:meth:`SnapshotBuffer.freeze`).

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
from kcover.checkpoint.files import exchange, open_regular, regular_size
from kcover.checkpoint.image import COMMITTED, HEADER_SIZE, WRITING, Header, Plan, pack_header, read_header
from kcover.checkpoint.landing import MADV_POPULATE_WRITE

log = logging.getLogger("kcover.checkpoint")

_STATE_OFFSET = 12  # the state field: written alone, first on begin and last on commit
_HEADROOM = 64 << 10


class Region:
    """One mapped snapshot file (or private memory): its bytes as a uint8 tensor and a memoryview."""

    def __init__(self, size: int, path: Path | None = None, create: bool = False) -> None:
        self.path, self.size, self._map = path, size, None
        self._pinned = False
        self.inode = 0
        self.views: weakref.ref[mmap.mmap] | None = None  # restored tensors' mapping of this file, if alive
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

    def populate(self) -> None:
        """Fault the whole file in now (``MADV_POPULATE_WRITE``), so that a snapshot copied in later takes no
        page faults; a kernel older than 5.14 leaves it to the copy."""
        if self._map is not None:
            with contextlib.suppress(OSError, ValueError):
                self._map.madvise(MADV_POPULATE_WRITE)

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
    """The committed snapshot (``current``) and the ``.next`` file: the previous snapshot, or the next one."""

    def __init__(self, path: Path | None, keep_previous: bool = True) -> None:
        self.path = path
        self.keep_previous = keep_previous
        self._wrote = False  # this process prepared a buffer (as the writer: a reader never does)
        self._warned_no_room = False
        self.current = self._map_existing(path)
        self.spare = self._map_existing(self._next_path) if keep_previous and path is not None else None

    @staticmethod
    def _map_existing(path: Path | None) -> Region | None:
        size = regular_size(path) if path is not None else None
        if path is not None and size is not None and size >= HEADER_SIZE:
            with contextlib.suppress(OSError, ValueError):
                return Region(size, path)
        return None

    @property
    def _next_path(self) -> Path:
        assert self.path is not None
        return self.path.with_name(self.path.name + ".next")

    @property
    def shared(self) -> bool:
        return self.path is not None

    def view(self) -> memoryview:
        """The committed snapshot's bytes (empty when there is none)."""
        return self.current.view() if self.current is not None else memoryview(b"")

    def regions(self) -> list[Region]:
        """The files that may hold a committed snapshot, newest first: the current one, then the previous."""
        return [region for region in (self.current, self.spare) if region is not None]

    def discard_leftover(self) -> None:
        """As the new writer: remove a ``.next`` file that holds no committed snapshot (a killed writer's)."""
        if self.path is None:
            return
        if self.spare is not None and self._named(self.spare) and committed(self.spare):
            return
        self._drop_spare()

    def _drop_spare(self) -> None:
        if self.spare is not None:
            self.spare.close()
            self.spare = None
        if self.path is not None:
            with contextlib.suppress(FileNotFoundError):
                self._next_path.unlink()

    def freeze(self, region: Region, views: mmap.mmap) -> None:
        """Do not write into ``region``'s file while ``views`` (a mapping restored tensors use) is alive."""
        region.views = weakref.ref(views)

    def prepare(self, size: int) -> Region:
        """A buffer of at least ``size`` bytes to write the next snapshot into (raises CheckpointWriteError)."""
        self._wrote = True
        in_place = self.path is None or not self.keep_previous
        if in_place and self.current is not None and self._reusable(self.current, size):
            return self.current  # the snapshot is gone until this one is committed
        if self.spare is not None and self._reusable(self.spare, size):
            return self.spare
        if self.spare is not None:
            self.spare.close()
            self.spare = None
        if self.path is None:
            self.spare = Region(size)
            return self.spare
        try:
            with contextlib.suppress(FileNotFoundError):  # never truncate a file restored tensors may map
                self._next_path.unlink()
            self.spare = Region(_with_headroom(size), self._next_path, create=True)
        except OSError as exc:
            with contextlib.suppress(OSError):
                self._next_path.unlink()
            if self.current is not None and self._reusable(self.current, size):
                log.log(logging.DEBUG if self._warned_no_room else logging.WARNING,
                        "kcover checkpoint: no room for a second snapshot at %s (%s): snapshots are written in "
                        "place, the previous one is not kept", self._next_path, exc.strerror or exc)
                self._warned_no_room = True
                return self.current
            raise CheckpointWriteError(
                f"cannot reserve {size} bytes of shared memory at {self._next_path}: {exc.strerror or exc}"
            ) from None
        return self.spare

    def wants_spare(self) -> bool:
        """Is there no second file yet (so one may be reserved now, before the next snapshot needs it)?

        A ``.next`` file that exists holds the previous snapshot: it is never replaced ahead of time.
        """
        return self.path is not None and self.keep_previous and not self._warned_no_room and self.spare is None

    def _reusable(self, region: Region, size: int) -> bool:
        in_use = region.views is not None and region.views() is not None
        return not in_use and self._named(region) and size <= region.size <= max(2 * size, size + (64 << 20))

    def _named(self, region: Region) -> bool:
        """Is ``region`` still the file at its name (not deleted by the node agent's sweep)?"""
        if region.path is None:
            return True
        try:
            return region.path.lstat().st_ino == region.inode
        except OSError:
            return False

    def publish(self, region: Region) -> None:
        """``region`` now holds a committed snapshot: make it the current one (atomically, by rename).

        The previous snapshot's file takes the ``.next`` name in the same step (when kept).
        """
        if region is self.current:
            return
        previous = self.current
        kept = False
        if region.path is not None and self.path is not None:
            try:
                kept = self.keep_previous and previous is not None and self._named(previous) \
                    and exchange(region.path, self.path)
                if not kept:
                    os.replace(region.path, self.path)
            except OSError as exc:  # its file was deleted (by hand, by a sweep): the next snapshot gets a new one
                log.warning("kcover checkpoint: cannot put the snapshot in place at %s: %s; it stays in this "
                            "process only", self.path, exc.strerror or exc)
                region.inode = 0
            region.path = self.path
        if kept:
            assert previous is not None
            previous.path = self._next_path
        elif previous is not None:
            previous.close()
        self.current, self.spare = region, previous if kept else None

    def touch(self) -> None:
        """Stamp the committed snapshot file with now: the node agent frees files no job saved for long."""
        if self.path is not None and self.current is not None:
            with contextlib.suppress(OSError):
                os.utime(self.path)

    def use_private(self) -> None:
        """Give up shared memory for this process (it was full or missing)."""
        if self.spare is not None:
            self.spare.close()
            self.spare = None
        self.path = None

    def close(self, remove: bool = False) -> None:
        """Unmap; the snapshot files stay (for a restarted worker) unless ``remove``.

        A ``.next`` file this process was writing that holds no committed snapshot goes in any case.
        """
        if self._wrote and self.spare is not None and self._named(self.spare) and not committed(self.spare):
            self._drop_spare()
        for region in (self.current, self.spare):
            if region is not None:
                region.close()
        self.current = self.spare = None
        if self.path is not None and remove:
            for path in (self._next_path, self.path):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
        self.path = None


def withdraw(region: Region) -> None:
    """Mark the snapshot in ``region`` as not committed: it is never restored (its file is reused later)."""
    struct.pack_into("<I", region.view(), _STATE_OFFSET, WRITING)


def header_of(region: Region) -> Header | None:
    """The header of the snapshot in ``region`` (None when the file is too short to have one)."""
    return read_header(region.view()[:HEADER_SIZE]) if region.size >= HEADER_SIZE else None


def committed(region: Region) -> bool:
    header = header_of(region)
    return header is not None and header.state == COMMITTED


def _with_headroom(size: int) -> int:
    """A new file's size: rounded up to 64 KiB, so a state that grows by a few bytes (a longer string, one
    more step digit) still fits the file the two snapshots take turns in."""
    return -(-size // _HEADROOM) * _HEADROOM


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
