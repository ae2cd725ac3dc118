"""FSDP2 / DTensor state: save each rank's local shard, restore it into the live sharded tensors.

:class:`~kcover.checkpoint.Checkpointer` stores dense tensors only.  For state
whose leaves are ``DTensor`` (FSDP2's ``model.state_dict()``, or
``torch.distributed.checkpoint.state_dict.get_state_dict``), each rank saves
``local_shards(state)`` — the same structure with every DTensor replaced by its
local shard — and on restart, with the same world size and mesh, calls
``copy_into(live_state, restored.state)``, which copies each restored tensor
into the live one (into ``.to_local()`` of a DTensor).  Resharding to another
world size is not done here: that is what ``torch.distributed.checkpoint`` is
for (see the README).
"""

from __future__ import annotations

from typing import Any

import torch


def _is_dtensor(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and type(value).__name__ == "DTensor" and hasattr(value, "to_local")


def local_shards(state: Any) -> Any:
    """``state`` with every DTensor leaf replaced by this rank's local shard (dicts, lists and tuples walked)."""
    if _is_dtensor(state):
        return state.to_local().detach()
    if isinstance(state, dict):
        return type(state)((key, local_shards(value)) for key, value in state.items())
    if isinstance(state, list | tuple):
        return type(state)(local_shards(value) for value in state)
    return state


@torch.no_grad()
def copy_into(live: Any, restored: Any) -> int:
    """Copy every restored tensor into the matching live tensor (a DTensor's local shard); returns how many.

    Raises ``KeyError``/``ValueError`` when the structures or shapes differ (another world size or model).
    """
    if isinstance(live, torch.Tensor):
        target: torch.Tensor = live.to_local() if _is_dtensor(live) else live  # type: ignore[attr-defined]
        if not isinstance(restored, torch.Tensor) or target.shape != restored.shape:
            raise ValueError(f"cannot restore {type(restored).__name__} {getattr(restored, 'shape', '')} "
                             f"into a tensor of shape {tuple(target.shape)}")
        target.copy_(restored)
        return 1
    if isinstance(live, dict):
        return sum(copy_into(value, restored[key]) for key, value in live.items())
    if isinstance(live, list | tuple):
        if len(live) != len(restored):
            raise ValueError(f"{len(restored)} restored items for {len(live)} live ones")
        return sum(copy_into(a, b) for a, b in zip(live, restored, strict=True))
    return 0
