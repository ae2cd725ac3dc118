"""States for the checkpoint tests: every value depends on the step, so a mixed-up restore shows."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch

OVERLAP_SCALE = 16384  # make_state(step, OVERLAP_SCALE): two 128 MiB tensors, copied in the background by overlap=


def make_state(step: int, scale: int = 1) -> dict[str, Any]:
    """A state whose every value depends on ``step``: a mix of dtypes, shapes and plain leaves."""
    generator = torch.Generator().manual_seed(step)
    weight = torch.randn(64 * scale, 32, generator=generator)
    return {
        "model": OrderedDict([
            ("weight", weight),
            ("bias", torch.full((32,), float(step))),
            ("half", torch.arange(48, dtype=torch.bfloat16) * step),
            ("index", torch.arange(10, dtype=torch.int64) + step),
            ("mask", torch.arange(7) % 2 == step % 2),
            ("scalar", torch.tensor(step * 0.5)),
            ("empty", torch.empty(0, 3)),
        ]),
        "optimizer": {"state": {0: {"step": torch.tensor(float(step)), "exp_avg": weight * 0.1}},
                      "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.999), "params": [0]}]},
        "step": step,
        "note": f"step {step}",
    }


def assert_state(state: Any, expected: Any) -> None:
    """Deep equality, tensors by dtype, shape and value."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(state, torch.Tensor)
        assert state.dtype == expected.dtype and state.shape == expected.shape
        assert torch.equal(state, expected)
    elif isinstance(expected, dict):
        assert type(state) is type(expected) and list(state) == list(expected)
        for key in expected:
            assert_state(state[key], expected[key])
    elif isinstance(expected, list | tuple):
        assert type(state) is type(expected) and len(state) == len(expected)
        for got, want in zip(state, expected, strict=True):
            assert_state(got, want)
    else:
        assert state == expected
