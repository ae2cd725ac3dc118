"""The supervision loop of ``kcover run``: collect, classify, stop, decide, restart.

One attempt at a time: start every worker, pump their output (faults and
progress), and watch for the end — all workers exited 0 (success), a fatal
fault or an abnormal exit (failure; wait ``settle`` seconds so the other ranks'
evidence arrives), no progress for the hang timeout (capture stacks, then
failure), or a signal to kcover itself (interrupted).  Then stop the whole
group, attribute the root cause across ranks, and ask the shared pure policy
(:func:`kcover.decide.policy.decide`) whether and where to restart.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

from kcover.classify.attribution import attribute
from kcover.classify.collector import FaultCollector
from kcover.classify.exit_codes import describe_exit, rule_for_exit
from kcover.classify.matcher import Matcher
from kcover.collect.lines import parse_line
from kcover.decide.lifecycle import JobPhase, Lifecycle
from kcover.decide.policy import AttemptEnd, DecisionKind, RecoveryState, decide
from kcover.explain import default_matcher
from kcover.faults import Evidence
from kcover.launcher.hang import HangDetector
from kcover.launcher.history import History
from kcover.launcher.inject import Injection, InjectKind, kernel_line
from kcover.launcher.output import FaultSeen, OutputPump, ProgressSeen
from kcover.launcher.reporting import AttemptRecord, ConsoleReporter, Reporter, RunResult
from kcover.launcher.spec import RunSpec, free_port, validate, worker_specs
from kcover.launcher.workers import Worker, WorkerGroup, become_subreaper, start_worker

TICK = 0.05


class Supervisor:
    def __init__(self, spec: RunSpec, reporter: Reporter | None = None, matcher: Matcher | None = None) -> None:
        validate(spec)
        self.spec = spec
        self.reporter = reporter or ConsoleReporter()
        self.matcher = matcher or default_matcher()
        self.stop_signal: int | None = None
        self.fired: set[tuple[Injection, int]] = set()

    # -- the run ---------------------------------------------------------------------------------
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
            while True:
                attempt = AttemptRecord(len(result.attempts) + 1, nodes, time.monotonic())
                result.attempts.append(attempt)
                history.begin_attempt(run_id, attempt.number, nodes, time.time())
                if life.phase is JobPhase.BACKOFF:
                    life.move(JobPhase.STARTING, time.monotonic())
                hung_at = self._attempt(attempt, state.restarts, life)
                verdict = attempt.verdict
                assert verdict is not None
                if attempt.outcome == "succeeded":
                    life.move(JobPhase.SUCCEEDED, time.monotonic())
                    result.status, result.reason = "succeeded", "all workers exited 0"
                    attempt.decision = "done"
                elif attempt.outcome == "interrupted":
                    life.move(JobPhase.INTERRUPTED, time.monotonic())
                    result.status = "interrupted"
                    result.reason = f"kcover received {signal.Signals(self.stop_signal or signal.SIGINT).name}"
                    attempt.decision = "interrupted"
                else:
                    decision, state = decide(spec.policy, state, AttemptEnd(verdict, nodes, hung_at))
                    attempt.decision, attempt.reason = decision.kind.value, decision.reason
                    self.reporter.event("decision", decision.reason)
                    if decision.kind is DecisionKind.FAIL:
                        life.move(JobPhase.FAILED, time.monotonic())
                        result.status, result.reason = "failed", decision.reason
                    else:
                        life.move(JobPhase.BACKOFF, time.monotonic())
                        nodes = decision.nodes
                        if not self._sleep(decision.delay):
                            life.move(JobPhase.INTERRUPTED, time.monotonic())
                            result.status, result.reason = "interrupted", "interrupted during backoff"
                history.end_attempt(run_id, attempt.number, time.time(), attempt.outcome, verdict,
                                    attempt.decision, attempt.reason)
                if life.finished:
                    break
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

    # -- one attempt -----------------------------------------------------------------------------
    def _attempt(self, attempt: AttemptRecord, restarts: int, life: Lifecycle) -> int | None:
        spec = self.spec
        folder = spec.state_dir / f"attempt-{attempt.number}"
        folder.mkdir(parents=True, exist_ok=True)
        collector = FaultCollector()
        pump = OutputPump(self.matcher, collector, folder, echo=sys.stderr.buffer if spec.echo else None)
        port = spec.master_port or free_port()
        workers: list[Worker] = []
        for worker_spec in worker_specs(spec, attempt.nodes, attempt.number, restarts, port, folder):
            worker = start_worker(worker_spec)
            workers.append(worker)
            pump.add(worker)
        group = WorkerGroup(workers)
        attempt.launched = time.monotonic()
        life.move(JobPhase.RUNNING, attempt.launched)
        self.reporter.event("start", f"attempt {attempt.number}: {len(workers)} workers on {', '.join(attempt.nodes)}")
        hang = HangDetector(attempt.launched, spec.hang_timeout, spec.startup_timeout)
        steps: dict[int, int] = {}
        trigger: float | None = None
        hung_at: int | None = None
        killed_by_us: set[int] = set()
        while True:
            now = time.monotonic()
            for seen in pump.pump(TICK):
                if isinstance(seen, ProgressSeen):
                    self._on_progress(attempt, hang, steps, seen)
                elif isinstance(seen, FaultSeen) and seen.fault.is_fatal:
                    trigger = self._on_fault(attempt, seen, trigger)
            for ended in group.poll():
                if ended.exit_code != 0 and ended.rank not in killed_by_us:
                    trigger = trigger or time.monotonic()
                    self.reporter.event("exit", f"rank {ended.rank} ({ended.node}) exited with {ended.exit_code}")
            killed_by_us |= self._inject(attempt, group, steps, collector, folder)
            now = time.monotonic()
            if self.stop_signal is not None:
                attempt.outcome = "interrupted"
                break
            if not group.running and all(w.exit_code == 0 for w in group.workers):
                attempt.outcome = "succeeded"
                break
            if trigger is not None and now - trigger >= spec.settle:
                attempt.outcome = "failed"
                break
            if trigger is None and hang.is_hung(now):
                hung_at = hang.step
                attempt.outcome = "hung"
                self._on_hang(attempt, hang, group, collector, folder, now)
                break
        attempt.stop_began = time.monotonic()
        if attempt.outcome != "succeeded":
            life.move(JobPhase.STOPPING, attempt.stop_began)
            stopped = group.stop(spec.grace_period)
            self.reporter.event("stop", f"stopped {len(workers)} workers in {stopped:.2f}s")
        for seen in pump.drain(5.0):
            if isinstance(seen, ProgressSeen):
                self._on_progress(attempt, hang, steps, seen)
        pump.close()
        group.close()
        if attempt.outcome == "failed":
            self._exit_faults(group, killed_by_us, attempt.stop_began, collector)
        attempt.ended = time.monotonic()
        attempt.verdict = attribute(collector.faults)
        if attempt.outcome in ("failed", "hung"):
            self.reporter.event("verdict", _verdict_line(attempt))
        return hung_at

    def _on_progress(self, attempt: AttemptRecord, hang: HangDetector, steps: dict[int, int],
                     seen: ProgressSeen) -> None:
        steps[seen.rank] = max(steps.get(seen.rank, -1), seen.step)
        if seen.checkpoint:
            attempt.last_checkpoint = seen.at
        if hang.observe(seen.step, seen.at):
            attempt.first_progress = attempt.first_progress or seen.at
            attempt.max_step = seen.step
            self.reporter.progress(seen.rank, seen.step)

    def _on_fault(self, attempt: AttemptRecord, seen: FaultSeen, trigger: float | None) -> float:
        fault = seen.fault
        if attempt.first_fault is None:
            attempt.first_fault, attempt.first_fault_wall = seen.at, time.time()
        where = f"rank {fault.rank}" if fault.rank is not None else (fault.node or fault.evidence.source)
        self.reporter.event("fault", f"{fault.category.value} ({fault.rule}) on {where}: {fault.evidence.line[:120]}")
        return trigger if trigger is not None else seen.at

    def _on_hang(self, attempt: AttemptRecord, hang: HangDetector, group: WorkerGroup, collector: FaultCollector,
                 folder: Path, now: float) -> None:
        text = hang.describe(now)
        self.reporter.event("hang", text)
        stacks = capture_stacks(group, folder / "stacks.txt")
        if stacks:
            self.reporter.event("evidence", f"Python stacks of {stacks} workers saved to {folder / 'stacks.txt'}")
        rule = self.matcher.classify_text(text)
        if rule is not None:
            collector.add(rule, Evidence(source="kcover", line=text, rank=None, node=None))
        attempt.first_fault = attempt.first_fault or now

    def _exit_faults(self, group: WorkerGroup, killed_by_us: set[int], stop_began: float,
                     collector: FaultCollector) -> None:
        for worker in group.workers:
            code = worker.exit_code
            ended_early = worker.exited_at is not None and worker.exited_at < stop_began
            if code in (None, 0) or worker.rank in killed_by_us or not ended_early:
                continue
            rule = rule_for_exit(self.matcher.rules, code)
            if rule is not None:
                collector.add(rule, Evidence(source=f"rank{worker.rank}", line=describe_exit(code),
                                             rank=worker.rank, node=worker.node))

    # -- fault injection ---------------------------------------------------------------------------
    def _inject(self, attempt: AttemptRecord, group: WorkerGroup, steps: dict[int, int],
                collector: FaultCollector, folder: Path) -> set[int]:
        touched: set[int] = set()
        elapsed = time.monotonic() - attempt.started
        for injection in self.spec.injections:
            key = (injection, attempt.number if injection.sticky else 0)
            worker = _target(group, injection.target)
            if key in self.fired or worker is None or worker.exit_code is not None:
                continue
            if injection.when == "step":
                reached = steps.get(worker.rank, -1) >= injection.value
            else:
                reached = elapsed >= injection.value
            if not reached:
                continue
            self.fired.add(key)
            self.reporter.event("inject", f"{injection.kind.value} on rank {worker.rank} ({worker.node})")
            line = kernel_line(injection.kind, worker.pid)
            if line is not None:
                self._kernel_message(worker.node, line, collector, folder)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(worker.pid, signal.SIGSTOP if injection.kind is InjectKind.HANG else signal.SIGKILL)
            if injection.kind is not InjectKind.HANG:
                touched.add(worker.rank)
        return touched

    def _kernel_message(self, node: str, line: str, collector: FaultCollector, folder: Path) -> None:
        """Record a node's kernel message as the node agent would read it from /dev/kmsg."""
        with (folder / f"{node}.kmsg").open("a") as kmsg:
            kmsg.write(line + "\n")
        parsed = parse_line(line.encode())
        rule = self.matcher.classify_text(parsed.text)
        if rule is not None:
            fault = collector.add(rule, Evidence(source=f"{node}/kmsg", line=parsed.text, node=node))
            if fault is not None:
                self.reporter.event("fault", f"{fault.category.value} ({fault.rule}) on {node}: {line[:120]}")

    # -- signals and waiting ---------------------------------------------------------------------
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


def _target(group: WorkerGroup, target: str) -> Worker | None:
    for worker in group.workers:
        if target == f"rank{worker.rank}" or target == worker.node:
            return worker
    return None


def _verdict_line(attempt: AttemptRecord) -> str:
    verdict = attempt.verdict
    if verdict is None or verdict.root is None:
        return "no fault recognised"
    blamed = f"; blamed {', '.join(verdict.nodes)}" if verdict.nodes else ""
    return f"{verdict.root.category.value}: {verdict.reason} → {verdict.action.value}{blamed}"


def capture_stacks(group: WorkerGroup, path: Path) -> int:
    """Python stacks of every running worker via py-spy (if installed); returns how many."""
    spy = shutil.which("py-spy")
    if spy is None:
        return 0
    captured = 0
    with path.open("w") as out:
        for worker in group.running:
            try:
                done = subprocess.run([spy, "dump", "--pid", str(worker.pid)], capture_output=True, text=True,
                                      timeout=15, check=False)
            except subprocess.TimeoutExpired:
                continue
            out.write(f"=== rank {worker.rank} ({worker.node}) pid {worker.pid}\n{done.stdout}{done.stderr}\n")
            captured += done.returncode == 0
    return captured
