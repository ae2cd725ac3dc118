"""Memory for a checkpoint that is being read in: allocated and faulted in at once.

A restore reads gigabytes into fresh memory; left to page faults one 4 KiB page
at a time, the faults cost as much as the copy.  :func:`landing_buffer` maps
anonymous memory with ``MAP_POPULATE`` (the kernel fills it in one call) and
hands it over as a uint8 tensor that keeps the mapping alive.  Used for reads
from disk (:mod:`~kcover.checkpoint.disk`) and from a peer
(:mod:`~kcover.checkpoint.replica_link`) alike, so that neither is favoured.
"""

from __future__ import annotations

import mmap

import torch

from kcover.checkpoint.errors import CheckpointError


def landing_buffer(size: int, what: str) -> torch.Tensor:
    """``size`` bytes of private memory, populated; raises CheckpointError naming ``what`` if there is none."""
    if size == 0:
        return torch.empty(0, dtype=torch.uint8)
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0)
    try:
        mapping = mmap.mmap(-1, size, flags=flags)
    except (OSError, OverflowError, ValueError):
        raise CheckpointError(f"{what}: cannot allocate {size} bytes of memory to read it") from None
    return torch.frombuffer(mapping, dtype=torch.uint8)
