"""A state dict ↔ a small pickled skeleton plus a flat list of tensors.

:class:`~kcover.checkpoint.Checkpointer` stores tensor bytes raw (one flat
image, copied at memory speed) and everything else — the nesting, the keys, the
plain Python leaves such as an optimizer's ``param_groups`` — as a pickle in
which every tensor is replaced by its index.  Pickle's ``persistent_id`` does
the extraction, so any container the user built works, and a tensor that
appears twice (tied weights) is stored once and comes back shared.

Loading uses a restricted unpickler by default, in the spirit of
``torch.load(weights_only=True)``: plain containers and scalars, ``OrderedDict``,
``torch.Size`` and dtypes only.  A state holding other objects is refused at
*save* time, with the offending class named, so that a checkpoint never turns
out unloadable at restore time; ``trusted=True`` lifts the restriction.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Callable, Sequence
from typing import Any

import torch

from kcover.checkpoint.errors import CheckpointError

_SAFE_BUILTINS = frozenset({
    "dict", "list", "tuple", "set", "frozenset", "int", "float", "complex", "str", "bytes", "bytearray",
    "bool", "slice", "range",
})


class _Extractor(pickle.Pickler):
    """Pickles a state, handing each distinct tensor out by index."""

    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.tensors: list[torch.Tensor] = []
        self._seen: dict[int, int] = {}

    def persistent_id(self, obj: Any) -> int | None:
        if not isinstance(obj, torch.Tensor):
            return None
        index = self._seen.get(id(obj))
        if index is None:
            check_tensor(obj)
            index = self._seen[id(obj)] = len(self.tensors)
            self.tensors.append(obj)
        return index


class _Restorer(pickle.Unpickler):
    def __init__(self, data: bytes, tensor: Callable[[int], Any], trusted: bool) -> None:
        super().__init__(io.BytesIO(data))
        self._tensor = tensor
        self._trusted = trusted

    def persistent_load(self, pid: Any) -> Any:
        return self._tensor(int(pid))

    def find_class(self, module: str, name: str) -> Any:
        if self._trusted or _allowed(module, name):
            return super().find_class(module, name)
        raise CheckpointError(
            f"the state holds a {module}.{name}, which is not a plain Python value or tensor; "
            "convert it (e.g. with .item() or to a dict) or create the Checkpointer with trusted=True"
        )


def _allowed(module: str, name: str) -> bool:
    if module == "builtins":
        return name in _SAFE_BUILTINS
    if module == "collections":
        return name == "OrderedDict"
    if module == "torch":
        return name == "Size" or isinstance(getattr(torch, name, None), torch.dtype)
    return False


def check_tensor(tensor: torch.Tensor) -> None:
    """Refuse tensors whose bytes are not one dense strided block we can restore faithfully."""
    kind = type(tensor).__name__
    if kind in {"DTensor", "ShardedTensor"}:
        raise CheckpointError(
            f"a {kind} leaf: save kcover.checkpoint.local_shards(state) (each rank's local shard) and restore "
            "with copy_into(), or use torch.distributed.checkpoint to reshard (see the README)"
        )
    if tensor.layout != torch.strided or tensor.is_quantized or tensor.is_meta:
        raise CheckpointError(f"unsupported tensor (layout {tensor.layout}, device {tensor.device}): only dense ones")


def flatten(state: Any, trusted: bool = False) -> tuple[bytes, list[torch.Tensor]]:
    """Split ``state`` into a pickled skeleton and its distinct tensors, in first-seen order."""
    buffer = io.BytesIO()
    extractor = _Extractor(buffer)
    try:
        extractor.dump(state)
    except (pickle.PicklingError, TypeError, AttributeError) as exc:
        raise CheckpointError(f"the state cannot be pickled: {exc}") from exc
    skeleton = buffer.getvalue()
    if not trusted:
        unflatten(skeleton, [torch.empty(0)] * len(extractor.tensors), trusted=False)
    return skeleton, extractor.tensors


def unflatten(skeleton: bytes, tensors: Sequence[torch.Tensor], trusted: bool = False) -> Any:
    """Rebuild the state from its skeleton and restored tensors."""

    def tensor(index: int) -> torch.Tensor:
        if not 0 <= index < len(tensors):
            raise CheckpointError(f"the skeleton refers to tensor {index} of {len(tensors)}")
        return tensors[index]

    try:
        return _Restorer(skeleton, tensor, trusted).load()
    except CheckpointError:
        raise
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, ImportError) as exc:
        raise CheckpointError(f"the state's skeleton cannot be read: {exc}") from exc


__all__ = ["check_tensor", "flatten", "unflatten"]
