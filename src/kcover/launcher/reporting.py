"""What a run tells people: live events, the final summary table, the ``--json`` document, ETTR.

A :class:`Reporter` receives events as they happen (the console reporter prints
one line each to stderr; the demo draws a live panel).  :class:`AttemptRecord`
(an attempt's :class:`~kcover.launcher.result.AttemptResult` and what was
decided after it) and :class:`RunResult` hold what the summary and the JSON need.

ETTR (effective training time ratio) = productive time ÷ wall time.  An
attempt's productive time is from its first reported step to its last complete
checkpoint (work after that checkpoint is lost and redone) — or to its end, for
the attempt that succeeds.  Start-up, detection, shutdown, backoff and restart
are unproductive.  Without checkpoint reports, a failed attempt counts as lost.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Any, Protocol, TextIO

from kcover.decide.lifecycle import JobPhase
from kcover.exit_codes import ExitCode
from kcover.faults import Fault, Verdict
from kcover.launcher.result import AttemptOutcome, AttemptResult, StragglerRecord
from kcover.report import fault_to_dict


class Reporter(Protocol):
    def event(self, kind: str, text: str) -> None: ...

    def progress(self, rank: int, step: int) -> None: ...


class ConsoleReporter:
    """One line per event on stderr, prefixed with the run's elapsed time."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.began = time.monotonic()

    def event(self, kind: str, text: str) -> None:
        elapsed = time.monotonic() - self.began
        print(f"kcover [{elapsed:7.1f}s] {kind:>9}: {text}", file=self.stream, flush=True)

    def progress(self, rank: int, step: int) -> None:
        return None


@dataclass(frozen=True)
class AttemptRecord:
    """One attempt as the run reports it: where and when it ran, its result, what was decided after it.

    Built by the supervisor once the attempt has ended (``result`` is ``None``
    only for an attempt that kcover itself failed during).
    """

    number: int
    nodes: tuple[str, ...]
    started: float
    result: AttemptResult | None = None
    decision: str = ""
    reason: str = ""

    @property
    def outcome(self) -> AttemptOutcome:
        return self.result.outcome if self.result else AttemptOutcome.RUNNING

    @property
    def verdict(self) -> Verdict | None:
        return self.result.verdict if self.result else None

    def productive(self) -> float:
        result = self.result
        if result is None or result.first_progress is None:
            return 0.0
        if result.outcome is AttemptOutcome.SUCCEEDED:
            return result.ended - result.first_progress
        if result.last_checkpoint is not None:
            return max(0.0, result.last_checkpoint - result.first_progress)
        return 0.0


@dataclass
class RunResult:
    status: JobPhase
    started: float
    ended: float
    attempts: list[AttemptRecord] = field(default_factory=list)
    excluded: tuple[str, ...] = ()
    reason: str = ""
    state_dir: str = ""
    run_dir: str = ""

    @property
    def restarts(self) -> int:
        return max(0, len(self.attempts) - 1)

    @property
    def wall(self) -> float:
        return self.ended - self.started

    @property
    def ettr(self) -> float:
        return sum(a.productive() for a in self.attempts) / self.wall if self.wall > 0 else 0.0

    @property
    def root(self) -> Fault | None:
        for attempt in reversed(self.attempts):
            verdict = attempt.verdict
            if verdict is not None and verdict.root is not None and attempt.outcome is not AttemptOutcome.SUCCEEDED:
                return verdict.root
        return None

    @property
    def exit_code(self) -> ExitCode:
        return {JobPhase.SUCCEEDED: ExitCode.SUCCESS, JobPhase.INTERRUPTED: ExitCode.INTERRUPTED}.get(
            self.status, ExitCode.FAILED)


def run_document(result: RunResult) -> dict[str, Any]:
    """The one JSON object ``kcover run --json`` prints at exit."""
    root = result.root
    faults = []
    for attempt in result.attempts:
        for fault in attempt.verdict.faults if attempt.verdict else ():
            faults.append({"attempt": attempt.number, **fault_to_dict(fault)})
    return {
        "status": result.status.value,
        "restarts": result.restarts,
        "reason": result.reason,
        "root_cause": {"category": root.category.value, "rule": root.rule, "node": root.node, "rank": root.rank}
        if root else None,
        "excluded_nodes": list(result.excluded),
        "ettr": round(result.ettr, 4),
        "faults": faults,
        "attempts": [_attempt_document(a) for a in result.attempts],
        "stragglers": [_straggler_document(a.number, s) for a in result.attempts if a.result
                       for s in a.result.stragglers],
        "timings": {
            "wall_seconds": round(result.wall, 3),
            "productive_seconds": round(sum(a.productive() for a in result.attempts), 3),
            "lost_seconds": round(result.wall - sum(a.productive() for a in result.attempts), 3),
        },
        "state_dir": result.state_dir,
        "run_dir": result.run_dir,
    }


def _straggler_document(attempt: int, straggler: StragglerRecord) -> dict[str, Any]:
    return {"attempt": attempt, "rank": straggler.rank, "node": straggler.node,
            "slowdown": round(straggler.slowdown, 3), "since_step": straggler.since_step,
            "action": straggler.action, "detail": straggler.detail}


def _attempt_document(attempt: AttemptRecord) -> dict[str, Any]:
    verdict = attempt.verdict
    return {
        "number": attempt.number,
        "nodes": list(attempt.nodes),
        "outcome": attempt.outcome.value,
        "max_step": attempt.result.max_step if attempt.result else None,
        "root_cause": None if verdict is None or verdict.root is None else {
            "category": verdict.root.category.value, "rule": verdict.root.rule,
            "nodes": list(verdict.nodes), "ranks": list(verdict.ranks), "action": verdict.action.value,
        },
        "decision": attempt.decision,
        "reason": attempt.reason,
        "timings": {**_timings(attempt.started, attempt.result), "productive_seconds": round(attempt.productive(), 3)},
    }


def _timings(started: float, result: AttemptResult | None) -> dict[str, float | None]:
    """Seconds from the attempt's start to each moment (all ``None`` for an attempt that never ended)."""
    if result is None:
        return dict.fromkeys(("launch_seconds", "first_progress_seconds", "first_fault_seconds", "first_fault_epoch",
                              "stop_seconds", "duration_seconds"))

    def since_start(moment: float | None) -> float | None:
        return None if moment is None else round(moment - started, 3)

    return {
        "launch_seconds": since_start(result.launched),
        "first_progress_seconds": since_start(result.first_progress),
        "first_fault_seconds": since_start(result.first_fault),
        "first_fault_epoch": result.first_fault_wall,
        "stop_seconds": None if result.stop_began is None else round(result.ended - result.stop_began, 3),
        "duration_seconds": since_start(result.ended),
    }


def print_summary(result: RunResult, stream: TextIO | None = None) -> None:
    """The table shown at exit: attempts, root causes, time lost, ETTR."""
    from rich.console import Console
    from rich.table import Table

    console = Console(file=stream or sys.stderr, highlight=False)
    table = Table(title=f"kcover run: {result.status}", title_justify="left", box=None, header_style="bold")
    for column in ("attempt", "nodes", "outcome", "steps", "root cause", "decision"):
        table.add_column(column, overflow="fold")
    for attempt in result.attempts:
        root = attempt.verdict.root if attempt.verdict else None
        cause = "" if root is None else f"{root.category.value} ({root.rule})"
        if attempt.verdict and attempt.verdict.nodes:
            cause += f" on {', '.join(attempt.verdict.nodes)}"
        table.add_row(str(attempt.number), ", ".join(attempt.nodes), attempt.outcome.value,
                      "" if attempt.result is None or attempt.result.max_step is None else str(attempt.result.max_step),
                      cause, attempt.decision)
    console.print(table)
    lost = result.wall - sum(a.productive() for a in result.attempts)
    console.print(
        f"restarts {result.restarts} · excluded {', '.join(result.excluded) or 'none'} · wall {result.wall:.1f}s · "
        f"lost {lost:.1f}s · [bold]ETTR {result.ettr:.2f}[/]"
    )
    slow = [f"rank {s.rank} ({s.node}) {s.slowdown:.2f}x in attempt {a.number}, {s.action}"
            for a in result.attempts if a.result for s in a.result.stragglers]
    if slow:
        console.print(f"stragglers: {'; '.join(slow)}")
    if result.reason:
        console.print(f"reason: {result.reason}")
