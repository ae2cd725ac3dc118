"""What to do about a straggler: report it, or restart the job without its node when that pays.

``--straggler-action report`` (the default) only reports.  ``replace`` restarts
the job on a spare node instead of the slow one, but only when the expected
gain beats the cost: :func:`judge_replace` compares

- gain = remaining time at the current pace × (1 - 1/slowdown): what finishing
  at the healthy pace saves;
- cost = the measured restart cost (this attempt's launch to its first step)
  + the work since the last checkpoint, redone at the healthy pace.

Without a spare node, or without knowing how many steps remain
(``--total-steps``), or before the pace is measured, it reports instead and
says why.  Pure: no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class StragglerAction(StrEnum):
    REPORT = "report"
    REPLACE = "replace"


@dataclass(frozen=True)
class ReplaceCase:
    """What :func:`judge_replace` needs to know, all measured during the attempt."""

    slowdown: float
    spares: int
    remaining_steps: int | None
    step_seconds: float | None
    """The job's current seconds per step (slowed by the straggler)."""
    restart_seconds: float | None
    """What a restart costs: this attempt's launch to its first step."""
    redo_steps: int
    """Steps since the last complete checkpoint (all of them without one)."""


@dataclass(frozen=True)
class ReplaceJudgement:
    replace: bool
    reason: str
    gain_seconds: float | None = None
    cost_seconds: float | None = None


def judge_replace(case: ReplaceCase, total_steps_option: str = "--total-steps") -> ReplaceJudgement:
    """Whether restarting without the straggler's node is worth it, and why (one line; ``total_steps_option``
    names where the user gives the job's steps)."""
    if case.spares <= 0:
        return ReplaceJudgement(False, "no spare node to replace it with; reporting only")
    if case.remaining_steps is None:
        return ReplaceJudgement(False, f"remaining steps unknown (give {total_steps_option}); reporting only")
    if case.step_seconds is None or case.restart_seconds is None or case.slowdown <= 1:
        return ReplaceJudgement(False, "pace or restart cost not measured yet; reporting only")
    healthy = case.step_seconds / case.slowdown
    gain = max(0, case.remaining_steps) * case.step_seconds * (1 - 1 / case.slowdown)
    cost = case.restart_seconds + max(0, case.redo_steps) * healthy
    numbers = f"gain {gain:.1f}s vs restart cost {cost:.1f}s"
    if gain > cost:
        return ReplaceJudgement(True, f"replacing its node: {numbers}", gain, cost)
    return ReplaceJudgement(False, f"not worth a restart: {numbers}; reporting only", gain, cost)
