"""Ranks agree on one step to restore, so that no rank resumes from a different step.

Rank 0 may have step 1200 on disk while rank 5 was killed before its shard of
1200 was committed, or finds its copy bit-flipped.  When ``torch.distributed``
is initialized, :func:`agree_on_step` has every rank propose the newest step it
can load, takes the minimum (one ``all_reduce``), checks that every rank can
load exactly that step (a second one), and otherwise retries below it.  Outside
a process group each rank simply takes its own newest loadable step.  Called
by :meth:`~kcover.checkpoint.Checkpointer.load_latest`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

NONE = -1


def group_size() -> int:
    """How many ranks agree (1 outside an initialized process group)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return int(dist.get_world_size())
    return 1


def _all_min(value: int) -> int:
    import torch.distributed as dist

    device = torch.device("cpu")
    if dist.get_backend() == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    tensor = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MIN)
    return int(tensor.item())


def agree_on_step(best_at_most: Callable[[int], int], can_load: Callable[[int], bool]) -> int:
    """The newest step every rank can load, or ``NONE``.

    ``best_at_most(bound)`` returns this rank's newest loadable step ≤ bound (or ``NONE``);
    ``can_load(step)`` says whether this rank can load exactly ``step``.
    """
    bound = 2**62
    if group_size() == 1:
        return best_at_most(bound)
    while True:
        agreed = _all_min(best_at_most(bound))
        if agreed == NONE:
            return NONE
        if _all_min(1 if can_load(agreed) else 0) == 1:
            return agreed
        bound = agreed - 1
