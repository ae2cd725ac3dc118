"""Training steps: the step parser and the hang detector that the launcher and the node agent share."""

from __future__ import annotations

import pytest

from kcover.steps import FLOOR_SECONDS, SAFETY_FACTOR, HangDetector, last_step


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


def test_hang_detector_allows_the_startup_time_before_the_first_step() -> None:
    hang = HangDetector(now=0.0, startup_timeout=100.0)
    assert not hang.is_hung(99.0)
    assert hang.is_hung(100.0)
    assert "no step reported yet" in hang.describe(100.0)


def test_hang_detector_learns_its_timeout_from_the_slowest_interval() -> None:
    hang = HangDetector(now=0.0, startup_timeout=10.0)
    assert hang.observe(1, 1.0) and hang.observe(2, 1.0 + 20.0)
    assert not hang.observe(2, 30.0)  # the same step again is no progress
    assert hang.timeout == max(FLOOR_SECONDS, SAFETY_FACTOR * 20.0)
    assert not hang.is_hung(21.0 + hang.timeout - 1)
    assert hang.is_hung(21.0 + hang.timeout)
    assert "last step 2" in hang.describe(21.0 + hang.timeout)


def test_a_fixed_timeout_is_never_learned() -> None:
    hang = HangDetector(now=0.0, fixed_timeout=5.0, startup_timeout=1.0)
    hang.observe(1, 1.0)
    hang.observe(2, 100.0)
    assert hang.timeout == 5.0 and hang.startup == 5.0
