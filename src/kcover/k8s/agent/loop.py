"""The agent's loop: tail, classify, report — every :data:`POLL_SECONDS`, for one node.

Container logs of opted-in pods are scanned block by block with the shared
catalog matcher; each new distinct fault is reported at once (an Event) and
recorded on its pod, repeats only counted.  Kernel messages are node-level:
they set the node condition and are recorded on every opted-in pod of the node
(the job on a broken node must learn of it).  Progress is read from the step
numbers in the logs with the launcher's own hang detector: a pod that reported
steps and then none for the job's ``kcover.io/hang-timeout`` (or the learned
timeout) gets one ``job.no-progress`` fault.  A pod that runs ``kcover pod``
reports its workers' generations in the same log (:mod:`kcover.podline`): the
agent records them on the pod (``kcover.io/pod-state``), turns a failed rank's
exit status into a fault, and starts each new generation afresh.  When each
run's first step came and its newest checkpoint go on the pod too
(``kcover.io/progress``, for the job's ETTR), and so do each rank's newest
compute seconds per step (``kcover.io/step-times``, for the operator's
straggler detector).  Offsets are saved after every
round that read something, so a restart neither misses nor repeats a report.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

from kubernetes import client

from kcover.classify.collector import FaultCollector
from kcover.classify.exit_codes import describe_exit, rule_for_exit
from kcover.classify.matcher import Matcher, default_matcher
from kcover.collect.lines import clean_block
from kcover.collect.partial_lines import join_partial_lines
from kcover.collect.sources import SourceInfo
from kcover.faults import NO_PROGRESS_RULE, Evidence
from kcover.k8s.agent.inject import InjectionDesk
from kcover.k8s.agent.kernel_faults import KernelFaults
from kcover.k8s.agent.pods import PodDirectory, PodInfo
from kcover.k8s.agent.report import KubeReporter
from kcover.k8s.agent.tail import KernelLog, Tailer, find_container_logs
from kcover.k8s.wire import PodStatus
from kcover.podline import PREFIX, PodReport, PodState, parse, parse_timings
from kcover.steps import HangDetector, last_step

POLL_SECONDS = 0.2
SWEEP_SECONDS = 60.0
log = logging.getLogger("kcover.agent")


class Agent:
    def __init__(self, api: client.ApiClient, node: str, log_root: Path, kmsg: Path | None, state_dir: Path,
                 matcher: Matcher | None = None) -> None:
        self.node = node
        self.log_root = log_root
        self.matcher = matcher or default_matcher()
        self.pods = PodDirectory(api, node)
        self.reporter = KubeReporter(api, node)
        self.tailer = Tailer(state_dir / f"offsets-{node}.json")
        self.kernel = KernelLog(kmsg, self.tailer) if kmsg is not None else None
        self.injections = InjectionDesk(api, node)  # `kcover inject`: FaultInjections for this node
        self.collectors: dict[str, FaultCollector] = {}
        self.progress: dict[str, HangDetector] = {}
        self.hung: set[str] = set()
        self.node_faults = KernelFaults()
        self.swept = time.monotonic()
        self.no_progress = next((r for r in self.matcher.rules if r.id == NO_PROGRESS_RULE), None)

    def run(self, stop: threading.Event) -> None:
        log.info("kcover agent on node %s: logs %s", self.node, self.log_root)
        if self.kernel is not None:
            log.info("kernel log %s: %s", self.kernel.path, self.kernel.status)
        while not stop.is_set():
            began = time.monotonic()
            try:
                self.poll_once()
            except Exception:
                log.exception("agent round failed; continuing")
            stop.wait(max(0.0, POLL_SECONDS - (time.monotonic() - began)))
        self.reporter.flush(force=True)
        self.tailer.save()

    def poll_once(self) -> int:
        """One round; returns the number of new faults."""
        pods = self.pods.refresh()
        new = 0
        read_any = False
        for container in find_container_logs(self.log_root):
            pod = pods.get(container.uid)
            if pod is None:
                continue
            found = self.tailer.read(container.path)
            if found is None:
                continue
            read_any = True
            block, first = found
            text = join_partial_lines(clean_block(block))
            new += self._scan(pod, text, first, f"{container.container}/{container.path.name}")
        new += self._hangs(pods, time.monotonic())
        if self.kernel is not None:
            kernel_block = self.kernel.read()
            if kernel_block:
                read_any = True
                new += self._kernel(clean_block(kernel_block), pods)
        new += self.injections.serve(pods, self._kernel)
        self.reporter.flush()
        if time.monotonic() - self.swept > SWEEP_SECONDS:  # logs of pods that are gone
            self.swept = time.monotonic()
            self.tailer.forget_missing()
            read_any = True
        if read_any:
            self.tailer.save()
        return new

    def _scan(self, pod: PodInfo, block: bytes, first: int, container: str) -> int:
        """Classify a block of the pod's log; ``kcover pod``'s reports in it split it by generation."""
        if PREFIX.encode() not in block:
            return self._scan_lines(pod, block, first, container)
        new = 0
        segment: list[bytes] = []
        segment_first = first
        for number, line in enumerate(block.splitlines(keepends=True), start=first):
            text = line.decode("utf-8", "replace") if PREFIX.encode() in line else None
            timings = parse_timings(text) if text is not None else None
            report = parse(text) if text is not None and timings is None else None
            if report is None and timings is None:
                segment.append(line)
                continue
            if segment:
                new += self._scan_lines(pod, b"".join(segment), segment_first, container)
            segment, segment_first = [], number + 1
            if timings is not None:
                self.reporter.record_for(pod).timed(timings)
            elif report is not None:
                new += self._pod_report(pod, report, f"{pod.name}/{container}")
        if segment:
            new += self._scan_lines(pod, b"".join(segment), segment_first, container)
        return new

    def _scan_lines(self, pod: PodInfo, block: bytes, first: int, container: str) -> int:
        collector = self.collectors.setdefault(pod.uid, FaultCollector())
        source = SourceInfo(name=f"{pod.name}/{container}", rank=pod.rank, node=self.node)
        new = 0
        for hit in self.matcher.scan_block(block, first):
            fault = collector.add_hit(source, hit)
            if fault is not None:
                new += 1
                self.reporter.new_fault(pod, fault)
        for fault in collector.faults:
            self.reporter.counted(pod, fault)
        step = last_step(block)
        if step is not None:
            detector = self.progress.setdefault(pod.uid, HangDetector(time.monotonic(), pod.hang_timeout))
            if detector.observe(step, time.monotonic()):
                self.hung.discard(pod.uid)
            record = self.reporter.record_for(pod)
            record.stepped(time.time())
            if detector.step is not None:
                record.note_step(detector.step)
        return new

    def _pod_report(self, pod: PodInfo, report: PodReport, source: str) -> int:
        """What ``kcover pod`` said: a new generation starts afresh (faults, progress, hang); a failed rank's exit
        status becomes a fault of the generation it failed in."""
        record = self.reporter.record_for(pod)
        if record.generation is not None and report.generation < record.generation:
            return 0  # a line from before the generation this agent already knows of
        if report.state is PodState.RUNNING and report.generation != record.generation:
            self.collectors.pop(pod.uid, None)
            self.progress.pop(pod.uid, None)
            self.hung.discard(pod.uid)
        carried = record.status.step if record.status and record.status.generation == report.generation else None
        step = report.step if report.step is not None else carried  # a new generation starts without one
        record.set_status(PodStatus(report.generation, report.state, report.in_place, step))
        if report.state is PodState.RUNNING and (report.step is not None or report.checkpoint is not None):
            at = _plausible(report.at, time.time())
            if report.checkpoint is not None:
                record.checkpointed(report.checkpoint, at)
            else:
                record.stepped(at, said=True)
        if report.state is not PodState.FAILED or report.exit is None:
            return 0
        rule = rule_for_exit(self.matcher.rules, report.exit)
        if rule is None:
            return 0
        rank = report.rank if report.rank is not None else pod.rank
        evidence = Evidence(source=source, line=f"rank {rank}: {describe_exit(report.exit)} in generation "
                            f"{report.generation}", rank=rank, node=self.node, step=report.step)
        fault = self.collectors.setdefault(pod.uid, FaultCollector()).add(rule, evidence)
        if fault is None:
            return 0
        self.reporter.new_fault(pod, fault)
        return 1

    def _hangs(self, pods: dict[str, PodInfo], now: float) -> int:
        """Pods that reported steps and then none for the hang timeout: one ``job.no-progress`` fault each."""
        new = 0
        for uid, detector in self.progress.items():
            pod = pods.get(uid)
            if pod is None or uid in self.hung or detector.last_progress is None or not detector.is_hung(now):
                continue
            self.hung.add(uid)
            if self.no_progress is None:
                continue
            evidence = Evidence(source=f"{pod.name}/progress", line=detector.describe(now), rank=pod.rank,
                                node=self.node, step=detector.step)
            fault = self.collectors.setdefault(uid, FaultCollector()).add(self.no_progress, evidence)
            if fault is not None:
                new += 1
                self.reporter.new_fault(pod, fault)
        return new

    def _kernel(self, block: bytes, pods: dict[str, PodInfo]) -> int:
        source = SourceInfo(name=f"{self.node}/kmsg", node=self.node)
        new = 0
        for hit in self.matcher.scan_block(block, 1):
            sighting = self.node_faults.add_hit(source, hit, pods)
            fault = sighting.fault
            if sighting.new and (fault.is_fatal or fault.node_at_fault):
                self.reporter.node_unhealthy(fault)
            for uid in sighting.tell:
                self.reporter.new_fault(pods[uid], fault)
            new += bool(sighting.new or sighting.tell)
        return new


def _plausible(at: float | None, now: float) -> float:
    """``kcover pod``'s time of a step or checkpoint (its node's clock, like ours), unless absent or absurd."""
    return at if at is not None and now - 86400 <= at <= now + 60 else now
