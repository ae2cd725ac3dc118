"""One attempt of a job: launch every worker, watch until it ends, stop and judge it.

:class:`Attempt` owns everything that lives for one attempt — the worker group,
the output pump, the fault collector, the hang detector — and :meth:`Attempt.run`
returns a frozen :class:`~kcover.launcher.result.AttemptResult` whose outcome
and verdict say how and why it ended.  It ends when all workers exit 0
(``succeeded``), after a fatal fault or abnormal exit plus ``settle`` seconds
for the other ranks' evidence unless the failing worker already exited
(``failed``), when no progress came for the hang timeout (``hung``: stacks
captured first), when ``--straggler-action replace`` judged a restart without a
straggler's node worth it (``straggler``: :mod:`kcover.launcher.stragglers`), or
when kcover is asked to stop (``interrupted``).  Injected faults
(:class:`~kcover.launcher.inject.Injector`) are asked for once per tick; the
throttles of ``slow`` injections are stopped (their ranks left running) before
the workers are, on every way out.

Its files (``rankR.log``, ``stacks.txt``, ``<node>.kmsg``) live in
``<run dir>/attempt-N/``.  A state dir that cannot be written (full disk) is
said once and otherwise ignored: the workers stay supervised.  Whatever ends
the attempt, an exception included, the workers are stopped before it returns.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from kcover.classify.attribution import attribute
from kcover.classify.collector import FaultCollector
from kcover.classify.exit_codes import describe_exit, rule_for_exit
from kcover.classify.matcher import Matcher
from kcover.collect.lines import parse_line
from kcover.faults import Evidence, Fault
from kcover.launcher.inject import Injector, Shot
from kcover.launcher.output import Event, FaultSeen, LogTrouble, OutputPump, ProgressSeen, TimingSeen
from kcover.launcher.reporting import Reporter
from kcover.launcher.result import AttemptOutcome, AttemptResult, TraceRecorder
from kcover.launcher.spec import RunSpec, worker_specs
from kcover.launcher.stacks import capture_stacks
from kcover.launcher.stragglers import StragglerWatch
from kcover.launcher.throttle import Throttle, stop_all
from kcover.launcher.workers import WorkerGroup, start_worker
from kcover.ports import free_port
from kcover.steps import HangDetector

TICK = 0.05
ROUND = 0.025
"""Shortest watch round while output trickles in: it is read in batches (fewer, larger reads).
A round that found a pipe full does not pause: the next one starts at once."""
STRAGGLER_RULE = "job.straggler"
"""The catalog rule of a straggler whose node is replaced: node at fault, so the policy excludes it."""


@dataclass(frozen=True)
class AttemptPlan:
    """What the supervisor decided for one attempt: its number, nodes, start and the restarts so far."""

    number: int
    nodes: tuple[str, ...]
    started: float
    restarts: int
    spares: int = 0


@dataclass
class _Moments:
    """When things happened during the attempt, filled in as they happen (frozen into the result at the end)."""

    launched: float | None = None
    first_progress: float | None = None
    last_checkpoint: float | None = None
    first_fault: float | None = None
    first_fault_wall: float | None = None
    stop_began: float | None = None
    max_step: int | None = None


class Attempt:
    def __init__(self, spec: RunSpec, plan: AttemptPlan, matcher: Matcher, reporter: Reporter,
                 injector: Injector, run_dir: Path) -> None:
        self.spec = spec
        self.plan = plan
        self.matcher = matcher
        self.reporter = reporter
        self.injector = injector
        self.folder = run_dir / f"attempt-{plan.number}"
        self.collector = FaultCollector()
        self.moments = _Moments()
        self.trace = TraceRecorder()
        self.steps: dict[int, int] = {}
        self.trigger: float | None = None
        self.killed_by_injection: set[int] = set()
        self.died: set[int] = set()  # ranks that exited non-zero on their own: their logs' ends may say why
        self.hung_at: int | None = None
        self.throttles: dict[int, Throttle] = {}
        self.stragglers = StragglerWatch(spec.straggler_action, spec.total_steps, plan.spares, {})

    def run(self, stop_requested: Callable[[], bool]) -> AttemptResult:
        """Launch, watch, stop and judge; returns how the attempt ended and why."""
        with contextlib.suppress(OSError):  # a full disk: the pump says so once, supervision goes on
            self.folder.mkdir(parents=True, exist_ok=True)
        pump = OutputPump(self.matcher, self.collector, self.folder,
                          echo=sys.stderr.buffer if self.spec.echo and sys.stderr is not None else None)
        group = WorkerGroup([])
        try:
            self._launch(pump, group)
            hang = HangDetector(time.monotonic(), self.spec.hang_timeout, self.spec.startup_timeout)
            outcome = self._watch(pump, group, hang, stop_requested)
            self._wind_down(pump, group, hang, outcome)
        finally:
            self._unthrottle_all()  # never leave a rank stopped, whatever ended the attempt
            if group.running:  # an exception ended the attempt: never leave a worker unsupervised
                group.stop(self.spec.grace_period)
            pump.close()
            group.close()
        tails = {source: tail for source, tail in self.collector.tails.items() if source.rank in self.died}
        verdict = attribute(self.collector.faults, tails=tails, progress=self.collector.progress,
                            ranks_read=self.collector.ranks_read)
        return AttemptResult(outcome, verdict, ended=time.monotonic(),
                             hung_at=self.hung_at, trace=self.trace.freeze(), stragglers=self.stragglers.freeze(),
                             **asdict(self.moments))

    def _launch(self, pump: OutputPump, group: WorkerGroup) -> None:
        """Start every worker into ``group`` (the caller stops and closes what started, whatever happens)."""
        port = self.spec.master_port or free_port()
        plan = self.plan
        specs = worker_specs(self.spec, plan.nodes, plan.number, plan.restarts, port, self.folder)
        self.stragglers.nodes = {worker_spec.rank: worker_spec.node for worker_spec in specs}
        for worker_spec in specs:
            group.workers.append(start_worker(worker_spec))
            pump.add(group.workers[-1])
        self.moments.launched = time.monotonic()
        self.reporter.event("start", f"attempt {plan.number}: {len(specs)} workers on {', '.join(plan.nodes)}")

    def _watch(self, pump: OutputPump, group: WorkerGroup, hang: HangDetector,
               stop_requested: Callable[[], bool]) -> AttemptOutcome:
        crashed = False
        while True:
            round_began = time.monotonic()
            for seen in pump.pump(TICK):
                self._on_event(hang, seen)
            for ended in group.poll():
                self._unthrottle(ended.rank)
                if ended.exit_code != 0 and ended.rank not in self.killed_by_injection:
                    self.trigger = self.trigger or time.monotonic()
                    crashed = True
                    self.reporter.event("exit", f"rank {ended.rank} ({ended.node}) exited with {ended.exit_code}")
            self._inject(group)
            now = time.monotonic()
            if stop_requested():
                return AttemptOutcome.INTERRUPTED
            if self.trigger is None and self._straggler_replaced(now):
                return AttemptOutcome.STRAGGLER
            if not group.running and all(w.exit_code == 0 for w in group.workers):
                return AttemptOutcome.SUCCEEDED
            if crashed or (self.trigger is not None and now - self.trigger >= self.spec.settle):
                return AttemptOutcome.FAILED
            if self.trigger is None and hang.is_hung(now):
                self._on_hang(hang, group, now)
                return AttemptOutcome.HUNG
            if not pump.busy:
                time.sleep(max(0.0, round_began + ROUND - time.monotonic()))

    def _wind_down(self, pump: OutputPump, group: WorkerGroup, hang: HangDetector, outcome: AttemptOutcome) -> None:
        stop_began = self.moments.stop_began = time.monotonic()
        self._unthrottle_all()  # before the workers: a stopped rank could not save a checkpoint
        if outcome is not AttemptOutcome.SUCCEEDED:
            stopped = group.stop(self.spec.grace_period)
            self.reporter.event("stop", f"stopped {len(group.workers)} workers in {stopped:.2f}s")
        else:
            group.stop(self.spec.grace_period)  # what the workers left running: background children, daemons
        for seen in pump.drain(5.0):
            if not isinstance(seen, FaultSeen):
                self._on_event(hang, seen)
        if outcome is AttemptOutcome.FAILED:
            self._exit_faults(group, stop_began)

    def _on_event(self, hang: HangDetector, seen: Event) -> None:
        if isinstance(seen, TimingSeen):
            self.stragglers.timing(seen)
        elif isinstance(seen, ProgressSeen):
            self._on_progress(hang, seen)
        elif isinstance(seen, LogTrouble):
            self.reporter.event("warning", seen.text)
        else:
            self._seen(seen.fault, seen.at)
            if seen.fault.is_fatal:
                self._on_fault(seen)

    def _on_progress(self, hang: HangDetector, seen: ProgressSeen) -> None:
        self.steps[seen.rank] = max(self.steps.get(seen.rank, -1), seen.step)
        moments = self.moments
        if seen.checkpoint:
            moments.last_checkpoint = seen.at
            self.trace.checkpoint(seen.at, seen.step)
            self.stragglers.checkpointed(seen.step)
        if hang.observe(seen.step, seen.at):
            self.stragglers.step(seen.step, seen.at, moments.launched)
            self.trace.step(seen.at, seen.step)
            moments.first_progress = moments.first_progress or seen.at
            moments.max_step = seen.step
            self.reporter.progress(seen.rank, seen.step)

    def _on_fault(self, seen: FaultSeen) -> None:
        fault = seen.fault
        if self.moments.first_fault is None:
            self.moments.first_fault, self.moments.first_fault_wall = seen.at, time.time()
        where = f"rank {fault.rank}" if fault.rank is not None else (fault.node or fault.evidence.source)
        self.reporter.event("fault", f"{fault.category.value} ({fault.rule}) on {where}: {fault.evidence.line[:120]}")
        self.trigger = self.trigger if self.trigger is not None else seen.at

    def _on_hang(self, hang: HangDetector, group: WorkerGroup, now: float) -> None:
        self.hung_at = hang.step
        self._unthrottle_all()  # let the stack dump see every rank running
        text = hang.describe(now)
        self.reporter.event("hang", text)
        try:
            stacks = capture_stacks(group, self.folder / "stacks.txt")
        except OSError as exc:
            stacks = 0
            self.reporter.event("warning", f"cannot save stacks to {self.folder / 'stacks.txt'}: {exc.strerror or exc}")
        if stacks:
            self.reporter.event("evidence", f"Python stacks of {stacks} workers in {self.folder / 'stacks.txt'}")
        rule = self.matcher.classify_text(text)
        if rule is not None:
            fault = self.collector.add(rule, Evidence(source="kcover", line=text))
            if fault is not None:
                self._seen(fault, now)
        self.moments.first_fault = self.moments.first_fault or now

    def _exit_faults(self, group: WorkerGroup, stop_began: float) -> None:
        """Faults for workers that died on their own, before kcover stopped the group."""
        for worker in group.workers:
            code = worker.exit_code
            died_first = worker.exited_at is not None and worker.exited_at < stop_began
            if code in (None, 0) or worker.rank in self.killed_by_injection or not died_first:
                continue
            assert code is not None
            self.died.add(worker.rank)
            rule = rule_for_exit(self.matcher.rules, code)
            if rule is not None:
                evidence = Evidence(source=f"rank{worker.rank}", line=describe_exit(code), rank=worker.rank,
                                    node=worker.node)
                fault = self.collector.add(rule, evidence)
                if fault is not None and worker.exited_at is not None:
                    self._seen(fault, worker.exited_at)

    def _inject(self, group: WorkerGroup) -> None:
        elapsed = time.monotonic() - self.plan.started
        for shot in self.injector.due(self.plan.number, group.workers, self.steps, elapsed):
            self._fire(shot)

    def _fire(self, shot: Shot) -> None:
        worker = shot.worker
        factor = f" ×{shot.injection.factor:g}" if shot.injection.factor is not None else ""
        self.reporter.event("inject", f"{shot.injection.kind.value}{factor} on rank {worker.rank} ({worker.node})")
        line = shot.kernel_line
        if line is not None:
            self._kernel_message(worker.node, line)
        throttle = shot.fire()
        if throttle is not None:
            self._unthrottle(worker.rank)
            self.throttles[worker.rank] = throttle
        if shot.kills:
            self.killed_by_injection.add(worker.rank)

    def _unthrottle(self, rank: int) -> None:
        throttle = self.throttles.pop(rank, None)
        if throttle is not None:
            throttle.stop()

    def _unthrottle_all(self) -> None:
        throttles = list(self.throttles.values())
        self.throttles.clear()
        stop_all(throttles)

    def _straggler_replaced(self, now: float) -> bool:
        """Report what the straggler watch found; True when a straggler's node is to be replaced (fault recorded)."""
        news = self.stragglers.check(now)
        for line in news.lines:
            self.reporter.event("straggler", line)
        chosen = news.replace
        if chosen is None:
            return False
        rule = next((r for r in self.matcher.rules if r.id == STRAGGLER_RULE), None)
        if rule is None:  # a catalog without the rule: the node could not be blamed, so only report
            self.reporter.event("warning", f"the catalog has no rule {STRAGGLER_RULE}; reporting only")
            self.stragglers.records[chosen.rank] = replace(chosen, action="reported")
            return False
        evidence = Evidence(source="kcover", line=chosen.detail, rank=chosen.rank, node=chosen.node)
        fault = self.collector.add(rule, evidence)
        if fault is not None:
            self._seen(fault, now)
            self._on_fault(FaultSeen(fault, now))
        return True

    def _kernel_message(self, node: str, line: str) -> None:
        """Record a node's kernel message as the node agent would read it from /dev/kmsg."""
        try:
            with (self.folder / f"{node}.kmsg").open("a") as kmsg:
                kmsg.write(line + "\n")
        except OSError as exc:
            self.reporter.event("warning", f"cannot write {self.folder / f'{node}.kmsg'}: {exc.strerror or exc}")
        parsed = parse_line(line.encode())
        text = parsed.text
        rule = self.matcher.classify_text(parsed.message)
        if rule is None:
            return
        fault = self.collector.add(rule, Evidence(source=f"{node}/kmsg", line=text, node=node))
        if fault is not None:
            self._seen(fault, time.monotonic())
        if fault is not None and fault.is_fatal:
            self._on_fault(FaultSeen(fault, time.monotonic()))

    def _seen(self, fault: Fault, at: float) -> None:
        """Remember when ``fault`` was first seen, for the report's timeline."""
        self.trace.fault((fault.rule, fault.rank, fault.node), at)
