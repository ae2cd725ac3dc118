"""Reading one candidate checkpoint back: from the shared-memory snapshot or from verified files.

:func:`memory_image` accepts a snapshot in shared memory only if it is
committed and was written by this rank, for this checkpoint dir (its token) and
— for sharded state — this world size.  :func:`map_private` gives the restored
tensors a private copy-on-write mapping of it: restoring costs no copy, and
writes to restored tensors never reach the snapshot.  :func:`load_from_disk`
checks the manifest, the world size, every block's checksum and the step
inside the image; :func:`peer_image` checks a replica fetched from a buddy.
:func:`materialize` turns an image into the user's state.
Called by :meth:`kcover.checkpoint.Checkpointer.load_latest`.
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from kcover.checkpoint import disk
from kcover.checkpoint.errors import CorruptCheckpointError, WorldSizeChangedError
from kcover.checkpoint.files import open_regular
from kcover.checkpoint.flatten import unflatten
from kcover.checkpoint.image import COMMITTED, Image, parse, tensor_views
from kcover.checkpoint.manifest import Manifest
from kcover.checkpoint.snapshot import Region, header_of

Source = Literal["memory", "peer", "disk"]


@dataclass(frozen=True)
class Restored:
    """What :meth:`Checkpointer.load_latest` found: the step, the state, and where it came from."""

    step: int
    state: Any
    source: Source
    where: str


def peer_image(data: torch.Tensor, where: str, step: int, rank: int, world_size: int, token: str) -> Image:
    """A replica fetched from a keeper, checked as a memory snapshot is; raises CorruptCheckpointError."""
    image = parse(data.numpy().data, where)
    header = image.header
    if header.state != COMMITTED or header.step != step or header.rank != rank or image.token != token:
        raise CorruptCheckpointError(f"{where}: not rank {rank}'s committed snapshot of step {step} for this "
                                     "checkpoint dir")
    if header.world_size != world_size and not image.replicated:
        raise WorldSizeChangedError(f"{where}: saved by {header.world_size} ranks, this job has {world_size}")
    return image


def memory_image(region: Region, rank: int, world_size: int, token: str) -> Image | None:
    """The snapshot in one file of the buffer, if it is this rank's, committed, for this dir; else None."""
    header = header_of(region)
    if header is None or header.state != COMMITTED or header.rank != rank:
        return None
    try:
        image = parse(region.view()[: region.size], str(region.path))
    except CorruptCheckpointError:
        return None
    if image.token != token or (header.world_size != world_size and not image.replicated):
        return None
    return image


def map_private(path: Path, size: int) -> mmap.mmap:
    """A copy-on-write mapping of the snapshot file: reads share its pages, writes stay in this process.

    Raises OSError when the file is gone, not a regular file, or shorter than ``size`` (a mapping past the
    end of a file kills the process with SIGBUS when touched).
    """
    fd = open_regular(path)
    try:
        if os.fstat(fd).st_size < size:
            raise OSError(f"{path}: shorter than the {size} bytes its header promises")
        return mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)


def usable_manifest(directory: Path, step: int, rank: int, world_size: int) -> Manifest:
    manifest = disk.read_manifest(directory, step, rank)
    if manifest.world_size != world_size and not manifest.replicated:
        raise WorldSizeChangedError(
            f"step {step} was saved by {manifest.world_size} ranks, this job has {world_size}: sharded "
            "state cannot be resharded by kcover (see the README: torch.distributed.checkpoint)"
        )
    return manifest


def load_from_disk(directory: Path, step: int, rank: int, world_size: int) -> tuple[torch.Tensor, Image]:
    manifest = usable_manifest(directory, step, rank, world_size)
    data = disk.read_verified(directory, manifest)
    where = str(disk.step_dir(directory, step) / manifest.file)
    image = parse(data.numpy().data, where)
    if image.header.step != step:
        raise CorruptCheckpointError(f"{where}: holds step {image.header.step}, not {step}")
    return data, image


def materialize(step: int, data: torch.Tensor, image: Image, source: Source, where: str,
                device: torch.device | None, trusted: bool) -> Restored:
    tensors = tensor_views(data, image.entries)
    if device is not None:
        tensors = [t.to(device) for t in tensors]
    return Restored(step, unflatten(image.skeleton, tensors, trusted), source, where)
