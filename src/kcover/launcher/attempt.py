"""One attempt of a job: launch every worker, watch until it ends, stop and judge it.

:class:`Attempt` owns everything that lives for one attempt — the worker group,
the output pump, the fault collector, the hang detector, the injections due —
and ends with an :class:`~kcover.launcher.reporting.AttemptRecord` whose verdict
says why it ended.  It ends when all workers exit 0 (``succeeded``), after a
fatal fault or abnormal exit plus ``settle`` seconds for the other ranks'
evidence unless the failing worker already exited (``failed``), when no progress came for the hang timeout (``hung``:
stacks captured first), or when kcover is asked to stop (``interrupted``).

Its files (``rankR.log``, ``stacks.txt``, ``<node>.kmsg``) live in
``<run dir>/attempt-N/``.  A state dir that cannot be written (full disk) is
said once and otherwise ignored: the workers stay supervised.  Whatever ends
the attempt, an exception included, the workers are stopped before it returns.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from kcover.classify.attribution import attribute
from kcover.classify.collector import FaultCollector
from kcover.classify.exit_codes import describe_exit, rule_for_exit
from kcover.classify.matcher import Matcher
from kcover.collect.lines import parse_line
from kcover.faults import Evidence
from kcover.launcher.hang import HangDetector
from kcover.launcher.inject import Injection, InjectKind, kernel_line
from kcover.launcher.output import Event, FaultSeen, LogTrouble, OutputPump, ProgressSeen
from kcover.launcher.reporting import AttemptRecord, Reporter
from kcover.launcher.spec import RunSpec, free_port, worker_specs
from kcover.launcher.workers import Worker, WorkerGroup, start_worker

TICK = 0.05
ROUND = 0.025
"""Shortest watch round while output trickles in: it is read in batches (fewer, larger reads).
A round that found a pipe full does not pause: the next one starts at once."""


class Attempt:
    def __init__(self, spec: RunSpec, record: AttemptRecord, restarts: int, matcher: Matcher,
                 reporter: Reporter, fired: set[tuple[Injection, int]], run_dir: Path) -> None:
        self.spec = spec
        self.record = record
        self.restarts = restarts
        self.matcher = matcher
        self.reporter = reporter
        self.fired = fired
        self.folder = run_dir / f"attempt-{record.number}"
        self.collector = FaultCollector()
        self.steps: dict[int, int] = {}
        self.trigger: float | None = None
        self.killed_by_injection: set[int] = set()
        self.hung_at: int | None = None

    def run(self, stop_requested: Callable[[], bool]) -> None:
        """Launch, watch, stop and judge; the outcome and verdict land in the record."""
        with contextlib.suppress(OSError):  # a full disk: the pump says so once, supervision goes on
            self.folder.mkdir(parents=True, exist_ok=True)
        pump = OutputPump(self.matcher, self.collector, self.folder,
                          echo=sys.stderr.buffer if self.spec.echo and sys.stderr is not None else None)
        group = WorkerGroup([])
        try:
            self._launch(pump, group)
            hang = HangDetector(time.monotonic(), self.spec.hang_timeout, self.spec.startup_timeout)
            self.record.outcome = self._watch(pump, group, hang, stop_requested)
            self._wind_down(pump, group, hang)
        finally:
            if group.running:  # an exception ended the attempt: never leave a worker unsupervised
                group.stop(self.spec.grace_period)
            pump.close()
            group.close()
        self.record.ended = time.monotonic()
        self.record.verdict = attribute(self.collector.faults)

    def _launch(self, pump: OutputPump, group: WorkerGroup) -> None:
        """Start every worker into ``group`` (the caller stops and closes what started, whatever happens)."""
        port = self.spec.master_port or free_port()
        specs = worker_specs(self.spec, self.record.nodes, self.record.number, self.restarts, port, self.folder)
        for worker_spec in specs:
            group.workers.append(start_worker(worker_spec))
            pump.add(group.workers[-1])
        self.record.launched = time.monotonic()
        self.reporter.event("start", f"attempt {self.record.number}: {len(specs)} workers on "
                                     f"{', '.join(self.record.nodes)}")

    def _watch(self, pump: OutputPump, group: WorkerGroup, hang: HangDetector,
               stop_requested: Callable[[], bool]) -> str:
        crashed = False
        while True:
            round_began = time.monotonic()
            for seen in pump.pump(TICK):
                self._on_event(hang, seen)
            for ended in group.poll():
                if ended.exit_code != 0 and ended.rank not in self.killed_by_injection:
                    self.trigger = self.trigger or time.monotonic()
                    crashed = True
                    self.reporter.event("exit", f"rank {ended.rank} ({ended.node}) exited with {ended.exit_code}")
            self._inject(group)
            now = time.monotonic()
            if stop_requested():
                return "interrupted"
            if not group.running and all(w.exit_code == 0 for w in group.workers):
                return "succeeded"
            if crashed or (self.trigger is not None and now - self.trigger >= self.spec.settle):
                return "failed"
            if self.trigger is None and hang.is_hung(now):
                self._on_hang(hang, group, now)
                return "hung"
            if not pump.busy:
                time.sleep(max(0.0, round_began + ROUND - time.monotonic()))

    def _wind_down(self, pump: OutputPump, group: WorkerGroup, hang: HangDetector) -> None:
        self.record.stop_began = time.monotonic()
        if self.record.outcome != "succeeded":
            stopped = group.stop(self.spec.grace_period)
            self.reporter.event("stop", f"stopped {len(group.workers)} workers in {stopped:.2f}s")
        else:
            group.stop(self.spec.grace_period)  # what the workers left running: background children, daemons
        for seen in pump.drain(5.0):
            if not isinstance(seen, FaultSeen):
                self._on_event(hang, seen)
        if self.record.outcome == "failed":
            self._exit_faults(group, self.record.stop_began)

    def _on_event(self, hang: HangDetector, seen: Event) -> None:
        if isinstance(seen, ProgressSeen):
            self._on_progress(hang, seen)
        elif isinstance(seen, LogTrouble):
            self.reporter.event("warning", seen.text)
        elif seen.fault.is_fatal:
            self._on_fault(seen)

    def _on_progress(self, hang: HangDetector, seen: ProgressSeen) -> None:
        self.steps[seen.rank] = max(self.steps.get(seen.rank, -1), seen.step)
        if seen.checkpoint:
            self.record.last_checkpoint = seen.at
        if hang.observe(seen.step, seen.at):
            self.record.first_progress = self.record.first_progress or seen.at
            self.record.max_step = seen.step
            self.reporter.progress(seen.rank, seen.step)

    def _on_fault(self, seen: FaultSeen) -> None:
        fault = seen.fault
        if self.record.first_fault is None:
            self.record.first_fault, self.record.first_fault_wall = seen.at, time.time()
        where = f"rank {fault.rank}" if fault.rank is not None else (fault.node or fault.evidence.source)
        self.reporter.event("fault", f"{fault.category.value} ({fault.rule}) on {where}: {fault.evidence.line[:120]}")
        self.trigger = self.trigger if self.trigger is not None else seen.at

    def _on_hang(self, hang: HangDetector, group: WorkerGroup, now: float) -> None:
        self.hung_at = hang.step
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
            self.collector.add(rule, Evidence(source="kcover", line=text))
        self.record.first_fault = self.record.first_fault or now

    def _exit_faults(self, group: WorkerGroup, stop_began: float) -> None:
        """Faults for workers that died on their own, before kcover stopped the group."""
        for worker in group.workers:
            code = worker.exit_code
            died_first = worker.exited_at is not None and worker.exited_at < stop_began
            if code in (None, 0) or worker.rank in self.killed_by_injection or not died_first:
                continue
            assert code is not None
            rule = rule_for_exit(self.matcher.rules, code)
            if rule is not None:
                evidence = Evidence(source=f"rank{worker.rank}", line=describe_exit(code), rank=worker.rank,
                                    node=worker.node)
                self.collector.add(rule, evidence)

    def _inject(self, group: WorkerGroup) -> None:
        elapsed = time.monotonic() - self.record.started
        for injection in self.spec.injections:
            key = (injection, self.record.number if injection.sticky else 0)
            worker = _target(group, injection.target)
            if key in self.fired or worker is None or worker.exit_code is not None:
                continue
            progress = self.steps.get(worker.rank, -1) if injection.when == "step" else elapsed
            if progress < injection.value:
                continue
            self.fired.add(key)
            self.reporter.event("inject", f"{injection.kind.value} on rank {worker.rank} ({worker.node})")
            line = kernel_line(injection.kind, worker.pid)
            if line is not None:
                self._kernel_message(worker.node, line)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(worker.pid, signal.SIGSTOP if injection.kind is InjectKind.HANG else signal.SIGKILL)
            if injection.kind is not InjectKind.HANG:
                self.killed_by_injection.add(worker.rank)

    def _kernel_message(self, node: str, line: str) -> None:
        """Record a node's kernel message as the node agent would read it from /dev/kmsg."""
        try:
            with (self.folder / f"{node}.kmsg").open("a") as kmsg:
                kmsg.write(line + "\n")
        except OSError as exc:
            self.reporter.event("warning", f"cannot write {self.folder / f'{node}.kmsg'}: {exc.strerror or exc}")
        text = parse_line(line.encode()).text
        rule = self.matcher.classify_text(text)
        if rule is None:
            return
        fault = self.collector.add(rule, Evidence(source=f"{node}/kmsg", line=text, node=node))
        if fault is not None and fault.is_fatal:
            self._on_fault(FaultSeen(fault, time.monotonic()))


def _target(group: WorkerGroup, target: str) -> Worker | None:
    return next((w for w in group.workers if target in (f"rank{w.rank}", w.node)), None)


def capture_stacks(group: WorkerGroup, path: Path) -> int:
    """Python stacks of every running worker via py-spy (if installed); returns how many."""
    beside = Path(sys.executable).parent / "py-spy"
    spy = shutil.which("py-spy") or (str(beside) if beside.exists() else None)
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
