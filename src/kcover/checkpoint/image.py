"""The snapshot image: one flat byte layout shared by memory snapshots and files.

A snapshot is a single buffer — the same bytes in ``/dev/shm`` and on disk, so
persisting is one sequential copy and restoring is one bulk copy plus views::

    [0, 4096)          header: magic, version, state, step, rank, world size, meta offset/length
    [4096, …)          tensor bytes, each tensor 64-byte aligned, in skeleton order
    [meta_offset, …)   JSON metadata (dtype, shape, offset, byte count, device of each tensor; the
                       skeleton's offset and length; the checkpoint dir's token), then the pickled skeleton

The header is written twice: ``WRITING`` before the first tensor byte and
``COMMITTED`` after the last, so a snapshot whose writer died half-way is never
taken for a complete one.  Callers: :mod:`kcover.checkpoint.snapshot` (write),
:mod:`kcover.checkpoint.disk` and :mod:`kcover.checkpoint.checkpointer` (read).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from kcover.checkpoint.errors import CorruptCheckpointError

MAGIC = b"KCVRSNP1"
VERSION = 1
HEADER_SIZE = 4096
ALIGN = 64
WRITING, COMMITTED = 1, 2
_HEADER = struct.Struct("<8sIIqQQQQII")


@dataclass(frozen=True)
class Entry:
    """Where one tensor's bytes live in the image."""

    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int
    device: str


@dataclass(frozen=True)
class Header:
    state: int
    step: int
    generation: int
    total: int
    meta_offset: int
    meta_length: int
    rank: int
    world_size: int


@dataclass(frozen=True)
class Plan:
    """The layout of one snapshot: computed before copying, so the buffer can be sized first."""

    entries: tuple[Entry, ...]
    meta: bytes
    meta_offset: int
    total: int


@dataclass(frozen=True)
class Image:
    """A parsed image: header, tensor entries, skeleton and the dir token it was written for."""

    header: Header
    entries: tuple[Entry, ...]
    skeleton: bytes
    token: str
    replicated: bool


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def make_plan(tensors: Sequence[torch.Tensor], skeleton: bytes, token: str, replicated: bool) -> Plan:
    entries = []
    offset = HEADER_SIZE
    for tensor in tensors:
        nbytes = tensor.numel() * tensor.element_size()
        entries.append(Entry(str(tensor.dtype), tuple(tensor.shape), offset, nbytes, str(tensor.device)))
        offset = _aligned(offset + nbytes)
    meta_offset = offset
    head = json.dumps({
        "tensors": [[e.dtype, list(e.shape), e.offset, e.nbytes, e.device] for e in entries],
        "skeleton_length": len(skeleton), "token": token, "replicated": replicated,
    }).encode()
    meta = struct.pack("<Q", len(head)) + head + skeleton
    return Plan(tuple(entries), meta, meta_offset, meta_offset + len(meta))


def pack_header(header: Header) -> bytes:
    h = header
    return _HEADER.pack(MAGIC, VERSION, h.state, h.step, h.generation, h.total, h.meta_offset, h.meta_length,
                        h.rank, h.world_size)


def read_header(data: memoryview | bytes) -> Header | None:
    """The header, or ``None`` when the bytes are not an image of this version."""
    if len(data) < _HEADER.size:
        return None
    magic, version, *fields = _HEADER.unpack_from(data, 0)
    if magic != MAGIC or version != VERSION:
        return None
    return Header(*fields)


def parse(data: memoryview, where: str) -> Image:
    """Parse and bounds-check a committed image; raises :class:`CorruptCheckpointError`."""
    header = read_header(data)
    if header is None or header.state != COMMITTED:
        raise CorruptCheckpointError(f"{where}: not a complete kcover snapshot")
    end = header.meta_offset + header.meta_length
    if header.total != end or len(data) < end or header.meta_length < 8:
        raise CorruptCheckpointError(f"{where}: truncated ({len(data)} bytes, header says {header.total})")
    meta = data[header.meta_offset : end]
    (head_length,) = struct.unpack_from("<Q", meta, 0)
    try:
        head = json.loads(bytes(meta[8 : 8 + head_length]))
        entries = tuple(Entry(d, tuple(s), o, n, dev) for d, s, o, n, dev in head["tensors"])
        skeleton = bytes(meta[8 + head_length :])
        if len(skeleton) != head["skeleton_length"]:
            raise ValueError("skeleton length")
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptCheckpointError(f"{where}: unreadable metadata ({exc})") from None
    for entry in entries:
        if entry.offset < HEADER_SIZE or entry.offset + entry.nbytes > header.meta_offset:
            raise CorruptCheckpointError(f"{where}: a tensor lies outside the data region")
    return Image(header, entries, skeleton, str(head["token"]), bool(head["replicated"]))


def dtype_of(name: str) -> torch.dtype:
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise CorruptCheckpointError(f"unknown dtype {name}")
    return dtype


def tensor_views(buffer: torch.Tensor, entries: Sequence[Entry]) -> list[torch.Tensor]:
    """Typed views of each tensor's bytes in ``buffer`` (a uint8 tensor holding the whole image)."""
    views = []
    for entry in entries:
        dtype = dtype_of(entry.dtype)
        raw = buffer[entry.offset : entry.offset + entry.nbytes]
        views.append(raw.view(dtype).view(entry.shape))
    return views
