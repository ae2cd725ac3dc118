"""What one attempt returns: how it ended, the verdict, and when things happened.

:meth:`kcover.launcher.attempt.Attempt.run` returns an :class:`AttemptResult`
(torch elastic's ``RunResult`` for one attempt); the supervisor decides from it
and builds the :class:`~kcover.launcher.reporting.AttemptRecord` it reports.
Nobody fills a shared record up and down.  Times are ``time.monotonic()``
seconds except ``first_fault_wall`` (epoch seconds, for correlating with other
logs).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from kcover.faults import Verdict


class AttemptOutcome(StrEnum):
    """How an attempt ended; the values are what ``--json`` and the run history say."""

    SUCCEEDED = "succeeded"
    """Every worker exited 0."""
    FAILED = "failed"
    """A fatal fault or an abnormal exit (after ``settle`` seconds for the other ranks' evidence)."""
    HUNG = "hung"
    """No progress for the hang timeout (stacks captured first)."""
    INTERRUPTED = "interrupted"
    """kcover was asked to stop."""
    RUNNING = "running"
    """Never ended: kcover itself failed during the attempt (only in the report of such a run)."""


@dataclass(frozen=True)
class AttemptResult:
    """The end of one attempt, as :meth:`~kcover.launcher.attempt.Attempt.run` returns it."""

    outcome: AttemptOutcome
    verdict: Verdict
    ended: float
    launched: float | None = None
    first_progress: float | None = None
    last_checkpoint: float | None = None
    first_fault: float | None = None
    first_fault_wall: float | None = None
    stop_began: float | None = None
    max_step: int | None = None
    """The newest step reported (by any rank)."""
    hung_at: int | None = None
    """The last step before a hang (``hung`` only): a hang that recurs at the same step is deterministic."""
