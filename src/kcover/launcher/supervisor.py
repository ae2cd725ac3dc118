"""The supervision loop of ``kcover run``: attempt, judge, decide, restart — until done.

Each attempt (:class:`~kcover.launcher.attempt.Attempt`) runs the whole job
once and ends with a verdict.  The supervisor feeds a failed attempt's verdict
to the shared pure policy (:func:`kcover.decide.policy.decide`), which says
whether and on which nodes to restart, keeps the job's lifecycle state machine
honest, records everything in the run history, and turns SIGINT/SIGTERM to
kcover itself into a clean, recorded ``interrupted`` run.
"""

from __future__ import annotations

import signal
import time
from types import FrameType

from kcover.classify.matcher import Matcher
from kcover.decide.lifecycle import JobPhase, Lifecycle
from kcover.decide.policy import AttemptEnd, DecisionKind, RecoveryState, decide
from kcover.explain import default_matcher
from kcover.launcher.attempt import TICK, Attempt
from kcover.launcher.history import History
from kcover.launcher.inject import Injection
from kcover.launcher.reporting import AttemptRecord, ConsoleReporter, Reporter, RunResult
from kcover.launcher.spec import RunSpec, validate
from kcover.launcher.workers import become_subreaper


class Supervisor:
    def __init__(self, spec: RunSpec, reporter: Reporter | None = None, matcher: Matcher | None = None) -> None:
        validate(spec)
        self.spec = spec
        self.reporter = reporter or ConsoleReporter()
        self.matcher = matcher or default_matcher()
        self.stop_signal: int | None = None
        self.fired: set[tuple[Injection, int]] = set()

    def run(self) -> RunResult:
        spec = self.spec
        become_subreaper()
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        history = History(spec.state_dir / "kcover.db")
        if history.warning:
            self.reporter.event("warning", history.warning)
        began = time.monotonic()
        result = RunResult(status="running", started=began, ended=began, state_dir=str(spec.state_dir.resolve()))
        run_id = history.begin_run(spec.command, time.time())
        nodes, spares = spec.node_names()
        state = RecoveryState(spares=spares)
        life = Lifecycle(began)
        try:
            while not life.finished:
                record = AttemptRecord(len(result.attempts) + 1, nodes, time.monotonic())
                result.attempts.append(record)
                history.begin_attempt(run_id, record.number, nodes, time.time())
                if life.phase is JobPhase.BACKOFF:
                    life.move(JobPhase.STARTING, time.monotonic())
                attempt = Attempt(spec, record, state.restarts, self.matcher, self.reporter, self.fired)
                life.move(JobPhase.RUNNING, time.monotonic())
                attempt.run(lambda: self.stop_signal is not None)
                state, nodes = self._conclude(record, attempt.hung_at, state, life, result)
                assert record.verdict is not None
                history.end_attempt(run_id, record.number, time.time(), record.outcome, record.verdict,
                                    record.decision, record.reason)
        finally:
            result.ended = time.monotonic()
            result.excluded = state.excluded
            if result.status == "running":
                result.status, result.reason = "failed", "kcover itself failed"
            history.end_run(run_id, time.time(), result.status, result.restarts, result.ettr, result.root,
                            result.reason)
            history.close()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
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
