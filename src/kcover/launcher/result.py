"""What one attempt returns: how it ended, the verdict, and when things happened.

:meth:`kcover.launcher.attempt.Attempt.run` returns an :class:`AttemptResult`
(torch elastic's ``RunResult`` for one attempt); the supervisor decides from it
and builds the :class:`~kcover.launcher.reporting.AttemptRecord` it reports.
Nobody fills a shared record up and down.  Times are ``time.monotonic()``
seconds except ``first_fault_wall`` (epoch seconds, for correlating with other
logs).  Its :class:`AttemptTrace` (steps, checkpoints and when each fault was
first seen, thinned to a bounded size) is what ``kcover report`` draws.
"""

from __future__ import annotations

from dataclasses import dataclass, field
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
    STRAGGLER = "straggler"
    """A rank was a straggler and ``--straggler-action replace`` stopped the attempt to restart without its node."""


FaultKey = tuple[str, int | None, str | None]
"""A fault as the trace knows it: rule, rank, node."""

MAX_SAMPLES = 2000
"""Step samples (and, apart, checkpoints) an attempt keeps at most: a longer run keeps every 2nd, 4th, …"""


@dataclass(frozen=True)
class AttemptTrace:
    """What happened during an attempt, over time: ``(moment, step)`` samples of new steps, checkpoints, and the
    moment each fault was first seen (``time.monotonic()`` seconds)."""

    steps: tuple[tuple[float, int], ...] = ()
    checkpoints: tuple[tuple[float, int], ...] = ()
    faults: tuple[tuple[FaultKey, float], ...] = ()


@dataclass(frozen=True)
class StragglerRecord:
    """A rank the straggler detector flagged during the attempt, and what kcover did about it."""

    rank: int
    node: str
    slowdown: float
    """How much slower than its own baseline (relative to its peers): 1.3 = 30% slower; the highest seen."""
    since_step: int
    at: float
    """When it was first flagged (``time.monotonic()``)."""
    action: str
    """``reported``, or ``replaced`` when the attempt was stopped to restart without its node."""
    detail: str


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
    trace: AttemptTrace = field(default_factory=AttemptTrace)
    stragglers: tuple[StragglerRecord, ...] = ()


class TraceRecorder:
    """Builds an :class:`AttemptTrace` as events arrive, in bounded memory (thinning by halves past the cap)."""

    def __init__(self) -> None:
        self.steps: list[tuple[float, int]] = []
        self.checkpoints: list[tuple[float, int]] = []
        self.faults: dict[FaultKey, float] = {}
        self._stride = {"steps": 1, "checkpoints": 1}
        self._seen = {"steps": 0, "checkpoints": 0}

    def step(self, at: float, step: int) -> None:
        self._add("steps", self.steps, at, step)

    def checkpoint(self, at: float, step: int) -> None:
        self._add("checkpoints", self.checkpoints, at, step)

    def fault(self, key: FaultKey, at: float) -> None:
        self.faults.setdefault(key, at)

    def freeze(self) -> AttemptTrace:
        return AttemptTrace(tuple(self.steps), tuple(self.checkpoints), tuple(self.faults.items()))

    def _add(self, kind: str, samples: list[tuple[float, int]], at: float, step: int) -> None:
        self._seen[kind] += 1
        if (self._seen[kind] - 1) % self._stride[kind]:
            return
        samples.append((at, step))
        if len(samples) >= MAX_SAMPLES:
            del samples[1::2]
            self._stride[kind] *= 2
