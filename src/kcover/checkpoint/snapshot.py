"""The host buffer that holds the newest snapshot, and the copy into it.

A :class:`SnapshotBuffer` is a file in ``/dev/shm`` mapped into the worker (so
the snapshot outlives the process: a restarted worker on the same machine maps
the same file and restores at memory speed), or private memory when shared
memory is unavailable or full.  Space is reserved with ``posix_fallocate`` —
writing into a tmpfs mapping that cannot get a page would kill the process
with SIGBUS, a reservation fails cleanly with ENOSPC instead — and pre-faulted
with ``MAP_POPULATE``, so the copy itself runs at memory bandwidth.  When CUDA
is present the buffer is registered as pinned memory, so device→host copies
run asynchronously at full PCIe/NVLink speed and are awaited once.

:func:`write_snapshot` is the only part of a save that blocks training.
Called by :class:`~kcover.checkpoint.checkpointer.Checkpointer`.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import struct
from collections.abc import Sequence
from pathlib import Path

import torch

from kcover.checkpoint.errors import CheckpointWriteError
from kcover.checkpoint.image import COMMITTED, HEADER_SIZE, WRITING, Header, Plan, pack_header, read_header

_STATE_OFFSET = 12  # the state field: written alone, first on begin and last on commit


class SnapshotBuffer:
    """One growable snapshot buffer: a mapped shared-memory file, or private memory when ``path`` is None."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.size = 0
        self._map: mmap.mmap | None = None
        self._private: torch.Tensor | None = None
        self.tensor = torch.empty(0, dtype=torch.uint8)
        self._pinned = False
        if path is not None and path.exists():
            with contextlib.suppress(OSError):
                self._attach(path.stat().st_size, create=False)

    @property
    def shared(self) -> bool:
        return self._map is not None

    def view(self) -> memoryview:
        if self._map is not None:
            return memoryview(self._map)
        return self.tensor.numpy().data

    def header(self) -> Header | None:
        return read_header(self.view()[:HEADER_SIZE]) if self.size >= HEADER_SIZE else None

    def ensure(self, size: int) -> None:
        """Make room for ``size`` bytes; falls back to private memory (``shared`` turns False) on failure."""
        if size <= self.size <= max(2 * size, size + (64 << 20)):
            return
        self._release()
        if self.path is not None:
            try:
                self._attach(size, create=True)
                return
            except OSError as exc:
                with contextlib.suppress(OSError):
                    self.path.unlink()
                raise CheckpointWriteError(
                    f"cannot reserve {size} bytes of shared memory at {self.path}: {exc.strerror or exc}"
                ) from None
        self._private = torch.empty(size, dtype=torch.uint8, pin_memory=torch.cuda.is_available())
        self.tensor, self.size = self._private, size

    def use_private(self) -> None:
        """Give up shared memory for this process (it was full or missing)."""
        self._release()
        self.path = None

    def _attach(self, size: int, create: bool) -> None:
        assert self.path is not None
        flags = os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT if create else 0)
        fd = os.open(self.path, flags, 0o600)
        try:
            if create:
                os.ftruncate(fd, 0)  # drop old pages first: the reservation must not double-count
                try:
                    os.posix_fallocate(fd, 0, size)
                except OSError as exc:
                    if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                        raise
                    os.ftruncate(fd, size)
            if size < HEADER_SIZE:
                return
            populate = getattr(mmap, "MAP_POPULATE", 0)
            self._map = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | populate)
        finally:
            os.close(fd)
        self.tensor = torch.frombuffer(self._map, dtype=torch.uint8)
        self.size = size
        self._pin()

    def _pin(self) -> None:
        if torch.cuda.is_available() and self.size:
            result = torch.cuda.cudart().cudaHostRegister(self.tensor.data_ptr(), self.size, 0)  # type: ignore[no-untyped-call]
            self._pinned = int(result) == 0

    def _release(self) -> None:
        if self._pinned:
            torch.cuda.cudart().cudaHostUnregister(self.tensor.data_ptr())  # type: ignore[no-untyped-call]
            self._pinned = False
        self.tensor = torch.empty(0, dtype=torch.uint8)
        self._private = None
        if self._map is not None:
            with contextlib.suppress(BufferError):  # a view still alive: the mapping goes with it
                self._map.close()
            self._map = None
        self.size = 0

    def close(self, remove: bool = False) -> None:
        self._release()
        if remove and self.path is not None:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()


def _copy_tensor(destination: torch.Tensor, tensor: torch.Tensor) -> None:
    source = tensor.detach()
    if not source.is_contiguous():
        source = source.contiguous()
    raw = source.reshape(-1).view(torch.uint8)
    destination.copy_(raw, non_blocking=raw.is_cuda)


def write_snapshot(
    buffer: SnapshotBuffer, plan: Plan, tensors: Sequence[torch.Tensor], header: Header
) -> None:
    """Copy ``tensors`` into ``buffer`` per ``plan``; the header says COMMITTED only once every byte is there."""
    view = buffer.view()
    struct.pack_into("<I", view, _STATE_OFFSET, WRITING)
    view[:HEADER_SIZE] = pack_header(Header(WRITING, *_fields(header))).ljust(HEADER_SIZE, b"\0")
    devices = set()
    for entry, tensor in zip(plan.entries, tensors, strict=True):
        if entry.nbytes:
            _copy_tensor(buffer.tensor[entry.offset : entry.offset + entry.nbytes], tensor)
        if tensor.is_cuda:
            devices.add(tensor.device)
    view[plan.meta_offset : plan.total] = plan.meta
    for device in devices:
        torch.cuda.synchronize(device)
    packed = pack_header(Header(WRITING, *_fields(header)))
    view[: len(packed)] = packed
    struct.pack_into("<I", view, _STATE_OFFSET, COMMITTED)


def _fields(header: Header) -> tuple[int, int, int, int, int, int, int]:
    h = header
    return h.step, h.generation, h.total, h.meta_offset, h.meta_length, h.rank, h.world_size
