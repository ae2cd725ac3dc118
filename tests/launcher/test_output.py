"""Reading progress out of log text: the step parser behind hang detection."""

from __future__ import annotations

import pytest

from kcover.launcher.output import last_step


@pytest.mark.parametrize(
    ("text", "step"),
    [
        (b"step 12 loss 2.0\n", 12),
        (b"[INFO] iteration 41200/250000 | lm loss: 2.1\n", 41200),
        (b"{'global_step': 7}\nglobal_step=77 x\n", 77),
        (b"Step: 5\n", 5),
        (b"iter 9 done\nstep 10 ok\n", 10),
        (b"stepper 3\nupstep 4\n", None),
        (b"loss 2.0 lr 3e-4\n", None),
        (b"x" * 10_000 + b"\nstep 99\n", 99),
    ],
)
def test_last_step(text: bytes, step: int | None) -> None:
    assert last_step(text) == step
