"""The supervision loop of ``kcover run``: attempt, judge, decide, restart — until done.

Each attempt (:class:`~kcover.launcher.attempt.Attempt`) runs the whole job
once and ends with a verdict.  The supervisor feeds a failed attempt's verdict
to the shared pure policy (:func:`kcover.decide.policy.decide`), which says
whether and on which nodes to restart, keeps the job's lifecycle state machine
honest, records everything in the run history, and turns SIGINT/SIGTERM/SIGHUP
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
from pathlib import Path
from types import FrameType

from kcover.classify.matcher import Matcher
from kcover.decide.lifecycle import JobPhase, Lifecycle
from kcover.decide.policy import AttemptEnd, DecisionKind, RecoveryState, decide
from kcover.explain import default_matcher
from kcover.launcher import statedir
from kcover.launcher.attempt import TICK, Attempt
from kcover.launcher.history import History
from kcover.launcher.inject import Injection
from kcover.launcher.reporting import AttemptRecord, ConsoleReporter, Reporter, RunResult
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
        self.fired: set[tuple[Injection, int]] = set()
        self.history_failed = False

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
        result = RunResult(status="running", started=began, ended=began, state_dir=str(spec.state_dir.resolve()),
                           run_dir=str(run_dir.resolve()))
        run_id = self._record(history.begin_run, spec.command, time.time()) or 0
        nodes, spares = spec.node_names()
        state = RecoveryState(spares=spares)
        life = Lifecycle(began)
        guardian = start_guardian()
        try:
            while not life.finished:
                record = AttemptRecord(len(result.attempts) + 1, nodes, time.monotonic())
                result.attempts.append(record)
                self._record(history.begin_attempt, run_id, record.number, nodes, time.time())
                if life.phase is JobPhase.BACKOFF:
                    life.move(JobPhase.STARTING, time.monotonic())
                attempt = Attempt(spec, record, state.restarts, self.matcher, self.reporter, self.fired, run_dir)
                life.move(JobPhase.RUNNING, time.monotonic())
                attempt.run(lambda: self.stop_signal is not None)
                state, nodes = self._conclude(record, attempt.hung_at, state, life, result)
                assert record.verdict is not None
                self._record(history.end_attempt, run_id, record.number, time.time(), record.outcome,
                             record.verdict, record.decision, record.reason)
        except LaunchError:
            raise
        except Exception as exc:  # a bug in kcover: the attempt stopped its workers; still record and report
            result.status, result.reason = "failed", f"kcover itself failed: {type(exc).__name__}: {exc}"
            self._report_crash(run_dir, result.reason)
        finally:
            result.ended = time.monotonic()
            result.excluded = state.excluded
            if result.status == "running":
                result.status, result.reason = "failed", "kcover itself failed"
            self._record(history.end_run, run_id, time.time(), result.status, result.restarts, result.ettr,
                         result.root, result.reason)
            guardian.release()
        return result

    def _conclude(self, record: AttemptRecord, hung_at: int | None, state: RecoveryState, life: Lifecycle,
                  result: RunResult) -> tuple[RecoveryState, tuple[str, ...]]:
        """Move the lifecycle on from an attempt's outcome; returns the new state and the next nodes."""
        now = time.monotonic()
        assert record.verdict is not None
        if record.outcome == "succeeded":
            life.move(JobPhase.SUCCEEDED, now)
            result.status, result.reason, record.decision = "succeeded", "all workers exited 0", "done"
            return state, record.nodes
        life.move(JobPhase.STOPPING, now)
        if record.outcome == "interrupted":
            life.move(JobPhase.INTERRUPTED, now)
            name = signal.Signals(self.stop_signal or signal.SIGINT).name
            result.status, result.reason, record.decision = "interrupted", f"kcover received {name}", "interrupted"
            return state, record.nodes
        self.reporter.event("verdict", _verdict_line(record))
        decision, state = decide(self.spec.policy, state, AttemptEnd(record.verdict, record.nodes, hung_at))
        record.decision, record.reason = decision.kind.value, decision.reason
        self.reporter.event("decision", decision.reason)
        if decision.kind is DecisionKind.FAIL:
            life.move(JobPhase.FAILED, time.monotonic())
            result.status, result.reason = "failed", decision.reason
            return state, record.nodes
        life.move(JobPhase.BACKOFF, time.monotonic())
        if not self._sleep(decision.delay):
            life.move(JobPhase.INTERRUPTED, time.monotonic())
            result.status, result.reason = "interrupted", "interrupted during backoff"
        return state, decision.nodes

    def _report_crash(self, run_dir: Path, reason: str) -> None:
        """Say why kcover failed; the traceback goes to ``<run dir>/kcover-error.txt`` for a bug report."""
        with contextlib.suppress(OSError):
            (run_dir / "kcover-error.txt").write_text(traceback.format_exc())
        with contextlib.suppress(Exception):  # the reporter may be what failed
            self.reporter.event("error", f"{reason} (traceback in {run_dir / 'kcover-error.txt'})")

    def _record(self, write: Callable[..., int | None], *args: object) -> int | None:
        """One history write; a full or read-only disk is said once, and the run goes on unrecorded."""
        if self.history_failed:
            return None
        try:
            return write(*args)
        except (sqlite3.Error, OSError) as exc:
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


def _verdict_line(record: AttemptRecord) -> str:
    verdict = record.verdict
    if verdict is None or verdict.root is None:
        return "no fault recognised"
    blamed = f"; blamed {', '.join(verdict.nodes)}" if verdict.nodes else ""
    return f"{verdict.root.category.value}: {verdict.reason} → {verdict.action.value}{blamed}"
