"""The supervision loop of ``kcover run``: attempt, judge, decide, restart — until done.

Each attempt (:class:`~kcover.launcher.attempt.Attempt`) runs the whole job
once and returns an :class:`~kcover.launcher.result.AttemptResult` (outcome
and verdict).  The supervisor feeds a failed attempt's verdict
to the shared pure policy (:func:`kcover.decide.policy.decide`), which says
whether and on which nodes to restart, keeps the job's lifecycle state machine
honest, builds the :class:`~kcover.launcher.reporting.AttemptRecord` it reports
from the result and the decision, records everything in the run history, and turns SIGINT/SIGTERM/SIGHUP
to kcover itself into a clean, recorded ``interrupted`` run.  A guardian process
(:mod:`kcover.launcher.guardian`) kills what the run started should kcover die
without that chance (``kill -9``).
"""

from __future__ import annotations

import contextlib
import signal
import sqlite3
import time
import traceback
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from types import FrameType

from kcover.classify.matcher import Matcher, default_matcher
from kcover.collect.printable import printable
from kcover.decide.lifecycle import JobPhase, Lifecycle
from kcover.decide.policy import AttemptEnd, DecisionKind, RecoveryState, decide
from kcover.faults import Verdict
from kcover.launcher import statedir
from kcover.launcher.attempt import TICK, Attempt, AttemptPlan
from kcover.launcher.history import AttemptTimeline, History
from kcover.launcher.inject import Injector
from kcover.launcher.node_memory import forget_node, memory_root, tidy
from kcover.launcher.reporting import AttemptRecord, ConsoleReporter, Reporter, RunResult
from kcover.launcher.result import AttemptOutcome, AttemptResult
from kcover.launcher.spec import RunSpec, validate
from kcover.launcher.workers import LaunchError, become_subreaper, start_guardian

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Supervisor:
    def __init__(self, spec: RunSpec, reporter: Reporter | None = None, matcher: Matcher | None = None) -> None:
        validate(spec)
        self.spec = spec
        self.reporter = reporter or ConsoleReporter()
        self.matcher = matcher or default_matcher()
        self.stop_signal: int | None = None
        self.injector = Injector(spec.injections)
        self.history_failed = False
        self.in_flight: AttemptRecord | None = None
        """The attempt under way, until its record joins the run's (reported as it is should kcover fail)."""

    def run(self) -> RunResult:
        claimed = statedir.claim(self.spec.state_dir)  # a second run on this state dir: usage error, nothing started
        previous = {sig: signal.signal(sig, self._on_signal) for sig in STOP_SIGNALS}
        try:
            become_subreaper()
            return self._run_claimed(claimed.run_dir)
        finally:
            claimed.release()
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _run_claimed(self, run_dir: Path) -> RunResult:
        spec = self.spec
        history = History(spec.state_dir / "kcover.db")
        try:
            if history.warning:
                self.reporter.event("warning", history.warning)
            return self._supervise(history, run_dir)
        finally:
            history.close()

    def _supervise(self, history: History, run_dir: Path) -> RunResult:
        spec = self.spec
        began = time.monotonic()
        result = RunResult(status=JobPhase.RUNNING, started=began, ended=began,
                           state_dir=str(spec.state_dir.resolve()), run_dir=str(run_dir.resolve()))
        run_id = self._record(history.begin_run, spec.command, time.time(), printable(str(run_dir.resolve())),
                              spec.nproc_per_node) or 0
        nodes, spares = spec.node_names()
        state = RecoveryState(spares=spares)
        life = Lifecycle(began)
        guardian = start_guardian()
        try:
            while not life.finished:
                plan = AttemptPlan(len(result.attempts) + 1, nodes, time.monotonic(), state.restarts,
                                   len(state.spares))
                state, nodes = self._attempt(plan, history, run_id, state, life, result, run_dir)
        except LaunchError as exc:
            if not result.attempts:
                raise  # the first launch: a usage error (command not found …), nothing ran
            result.status, result.reason = JobPhase.FAILED, f"cannot start the workers again: {exc}"
        except Exception as exc:  # a bug in kcover: the attempt stopped its workers; still record and report
            result.status, result.reason = JobPhase.FAILED, f"kcover itself failed: {type(exc).__name__}: {exc}"
            self._report_crash(run_dir, result.reason)
        finally:
            if self.in_flight is not None:
                result.attempts.append(self.in_flight)
                self.in_flight = None
            result.ended = time.monotonic()
            result.excluded = state.excluded
            if result.status is JobPhase.RUNNING:
                result.status, result.reason = JobPhase.FAILED, "kcover itself failed"
            tidy(memory_root(spec.state_dir), finished=result.status is JobPhase.SUCCEEDED)
            self._record(history.end_run, run_id, time.time(), result.status, result.restarts, result.ettr,
                         result.root, result.reason, result.excluded, final=True)
            guardian.release()
        return result

    def _attempt(self, plan: AttemptPlan, history: History, run_id: int, state: RecoveryState, life: Lifecycle,
                 result: RunResult, run_dir: Path) -> tuple[RecoveryState, tuple[str, ...]]:
        """Run one attempt, decide what follows, record it; returns the new state and the next nodes."""
        self.in_flight = AttemptRecord(plan.number, plan.nodes, plan.started)
        self._record(history.begin_attempt, run_id, plan.number, plan.nodes, time.time())
        if life.phase is JobPhase.BACKOFF:
            life.move(JobPhase.STARTING, time.monotonic())
        attempt = Attempt(self.spec, plan, self.matcher, self.reporter, self.injector, run_dir)
        life.move(JobPhase.RUNNING, time.monotonic())
        ended = attempt.run(lambda: self.stop_signal is not None)
        self.in_flight = AttemptRecord(plan.number, plan.nodes, plan.started, ended)
        decision, reason, state, nodes = self._conclude(plan, ended, state, life, result)
        record = AttemptRecord(plan.number, plan.nodes, plan.started, ended, decision, reason)
        result.attempts.append(record)
        self.in_flight = None
        self._record(history.end_attempt, run_id, plan.number, time.time(), ended.outcome.value, ended.verdict,
                     decision, reason, _timeline(record))
        if ended.stragglers:
            offset = time.time() - time.monotonic()
            self._record(history.record_stragglers, run_id, plan.number,
                         [replace(s, at=round(s.at + offset, 3)) for s in ended.stragglers])
        return state, nodes

    def _conclude(self, plan: AttemptPlan, ended: AttemptResult, state: RecoveryState, life: Lifecycle,
                  result: RunResult) -> tuple[str, str, RecoveryState, tuple[str, ...]]:
        """Move the lifecycle on from an attempt's end; returns the decision, its reason, the new state, next nodes."""
        now = time.monotonic()
        if ended.outcome is AttemptOutcome.SUCCEEDED:
            life.move(JobPhase.SUCCEEDED, now)
            result.status, result.reason = JobPhase.SUCCEEDED, "all workers exited 0"
            return "done", "", state, plan.nodes
        life.move(JobPhase.STOPPING, now)
        if ended.outcome is AttemptOutcome.INTERRUPTED:
            life.move(JobPhase.INTERRUPTED, now)
            name = signal.Signals(self.stop_signal or signal.SIGINT).name
            result.status, result.reason = JobPhase.INTERRUPTED, f"kcover received {name}"
            return "interrupted", "", state, plan.nodes
        self.reporter.event("verdict", _verdict_line(ended.verdict))
        end = AttemptEnd(ended.verdict, plan.nodes, ended.hung_at, ran_for=ended.ended - plan.started)
        decision, state = decide(self.spec.policy, state, end)
        self.reporter.event("decision", decision.reason)
        if decision.kind is not DecisionKind.FAIL:
            for node in set(plan.nodes) - set(decision.nodes):  # replaced or dropped: its memory is gone with it
                forget_node(memory_root(self.spec.state_dir), node)
        if decision.kind is DecisionKind.FAIL:
            life.move(JobPhase.FAILED, time.monotonic())
            result.status, result.reason = JobPhase.FAILED, decision.reason
            return decision.kind.value, decision.reason, state, plan.nodes
        life.move(JobPhase.BACKOFF, time.monotonic())
        if not self._sleep(decision.delay):
            life.move(JobPhase.INTERRUPTED, time.monotonic())
            result.status, result.reason = JobPhase.INTERRUPTED, "interrupted during backoff"
        return decision.kind.value, decision.reason, state, decision.nodes

    def _report_crash(self, run_dir: Path, reason: str) -> None:
        """Say why kcover failed; the traceback goes to ``<run dir>/kcover-error.txt`` for a bug report."""
        with contextlib.suppress(OSError):
            (run_dir / "kcover-error.txt").write_text(traceback.format_exc())
        with contextlib.suppress(Exception):  # the reporter may be what failed
            self.reporter.event("error", f"{reason} (traceback in {run_dir / 'kcover-error.txt'})")

    def _record(self, write: Callable[..., int | None], *args: object, final: bool = False) -> int | None:
        """One history write; a full or read-only disk is said once, and the run goes on unrecorded.

        The run's end (``final``) is tried even after a failed write: a passing lock or a moment of
        full disk must not leave the run ``running`` for ever (later shown as ``lost``).
        """
        if self.history_failed and not final:
            return None
        try:
            return write(*args)
        except (sqlite3.Error, OSError) as exc:
            if not self.history_failed:
                self.reporter.event("warning", f"cannot record the run in {self.spec.state_dir / 'kcover.db'}: "
                                               f"{exc}; the run goes on unrecorded")
            self.history_failed = True
            return None

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self.stop_signal = signum

    def _sleep(self, seconds: float) -> bool:
        """Sleep unless kcover is asked to stop; False when interrupted."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.stop_signal is not None:
                return False
            time.sleep(min(TICK, deadline - time.monotonic()))
        return self.stop_signal is None


def _verdict_line(verdict: Verdict) -> str:
    if verdict.root is None:
        return "no fault recognised"
    blamed = f"; blamed {', '.join(verdict.nodes)}" if verdict.nodes else ""
    return f"{verdict.root.category.value}: {verdict.reason} → {verdict.action.value}{blamed}"


def _timeline(record: AttemptRecord) -> AttemptTimeline:
    """The attempt's moments and trace in epoch seconds, for the history (``kcover report`` draws them)."""
    result = record.result
    if result is None:
        return AttemptTimeline()
    offset = time.time() - time.monotonic()

    def epoch(moment: float | None) -> float | None:
        return None if moment is None else round(moment + offset, 3)

    trace = result.trace
    return AttemptTimeline(
        moments={"launched": epoch(result.launched), "first_progress": epoch(result.first_progress),
                 "last_checkpoint": epoch(result.last_checkpoint), "first_fault": epoch(result.first_fault),
                 "stop_began": epoch(result.stop_began), "stopped": epoch(result.ended),
                 "max_step": result.max_step, "hung_at": result.hung_at,
                 "productive_seconds": round(record.productive(), 3)},
        faults={key: round(at + offset, 3) for key, at in trace.faults},
        steps=tuple((round(at + offset, 3), step) for at, step in trace.steps),
        checkpoints=tuple((round(at + offset, 3), step) for at, step in trace.checkpoints),
    )
