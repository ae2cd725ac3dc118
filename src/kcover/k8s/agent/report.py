"""Telling the API server what the agent saw: Events, pod fault records, the node condition.

Each new distinct fault becomes a Kubernetes Event on its pod at once (reason
``KcoverFault``, the rule and the evidence line in the message); the pod's
``kcover.io/faults`` annotation carries the durable record the operator reads,
rewritten at most once a second per pod however fast a flood repeats (repeats
only raise counts).  The pod's ``kcover.io/progress`` (when its run's first step
came, its newest checkpoint: :mod:`kcover.k8s.progress`) rides on the same
writes.  Node-level faults (the kernel log) also set the node
condition ``KcoverHealthy=False``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import time
from dataclasses import replace
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kcover.collect.lines import line_shape
from kcover.faults import Fault, Severity
from kcover.health.quarantine.kube import KubeQuarantine
from kcover.k8s import wire
from kcover.k8s.agent.pods import PodInfo
from kcover.k8s.names import POD_FAULTS, POD_STATE, PROGRESS, STEP_TIMES
from kcover.k8s.progress import PodProgress
from kcover.podline import PodTimings
from kcover.timestamps import rfc3339

WRITE_INTERVAL = 1.0


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _camel(text: str) -> str:
    return "".join(part.capitalize() for part in text.replace(".", "_").replace("-", "_").split("_"))


class PodRecord:
    """The faults recorded on one pod: what was there before this agent started, plus new ones.

    With ``kcover pod`` in the pod, each fault belongs to the generation of the
    workers it was seen in (:attr:`status`); when the records outgrow
    :data:`~kcover.k8s.wire.MAX_RECORDS`, the current generation's are kept
    first and the oldest others dropped.
    """

    def __init__(self, pod: PodInfo, earlier: list[dict[str, Any]], status: wire.PodStatus | None = None,
                 progress: PodProgress | None = None) -> None:
        self.pod = pod
        self.earlier = earlier
        self.status = status
        self.progress = progress
        self.times: dict[int, dict[int, float]] = {}
        """The current generation's newest compute seconds per rank and step (``kcover.io/step-times``)."""
        self.faults: dict[tuple[int | None, str, str, str], tuple[Fault, int | None]] = {}
        self.dirty = False
        self.written = 0.0

    @property
    def generation(self) -> int | None:
        return self.status.generation if self.status else None

    def set_status(self, status: wire.PodStatus) -> None:
        if status != self.status:
            if self.status is not None and status.generation != self.status.generation:
                self.times.clear()
            self.status = status
            self.dirty = True

    def timed(self, timings: PodTimings) -> None:
        """A batch of one rank's compute seconds, when of the current generation; the newest steps are kept."""
        if timings.generation != self.generation:
            return
        if timings.rank not in self.times and len(self.times) >= wire.MAX_TIMED_RANKS:
            return
        steps = self.times.setdefault(timings.rank, {})
        steps.update(timings.steps())
        for step in sorted(steps)[:-wire.MAX_TIMED_STEPS]:
            del steps[step]
        self.dirty = True

    def note_step(self, step: int) -> None:
        """The generation's newest step, carried by the next write (a step alone is not worth one)."""
        if self.status is not None and self.status.step != step:
            self.status = replace(self.status, step=step)

    def stepped(self, at: float, said: bool = False) -> None:
        """A step of the pod's current run was seen (``said``: ``kcover pod`` said when its generation's first step
        came): the run's first step starts its productive time."""
        progress = self.progress
        if progress is None or progress.generation != self.generation:
            self.progress = PodProgress(at, self.generation)
            self.dirty = True
        elif said and at != progress.first:
            # kcover pod's time wins over the agent's reading of a step-like log line (e.g. "resuming from step
            # 1180", printed before the first step of the generation)
            self.progress = replace(progress, first=at)
            self.dirty = True

    def checkpointed(self, step: int, at: float) -> None:
        """The workers of the current generation completed a checkpoint of ``step`` at ``at``."""
        self.stepped(at)
        assert self.progress is not None
        if self.progress.checkpoint is None or step > self.progress.checkpoint:
            self.progress = replace(self.progress, checkpoint=step, checkpoint_at=max(at, self.progress.first))
            self.dirty = True

    def merge(self, fault: Fault) -> None:
        key = (self.generation, fault.evidence.source, fault.rule, fault.evidence.line[:200])
        self.faults[key] = (fault, self.generation)
        self.dirty = True

    def known(self, fault: Fault) -> bool:
        """True when an earlier agent already reported this fault (same generation, source, rule, line shape)."""
        shape = line_shape(fault.evidence.line)
        return any(r.get("generation") == self.generation and r.get("source") == fault.evidence.source
                   and r.get("rule") == fault.rule and line_shape(str(r.get("line", ""))) == shape
                   for r in self.earlier)

    def records(self) -> list[dict[str, Any]]:
        """Earlier records (counts carried on) followed by this agent's new ones."""
        merged = [dict(r) for r in self.earlier]
        index = {(r.get("generation"), r.get("source"), r.get("rule"), line_shape(str(r.get("line", "")))): r
                 for r in merged}
        for fault, generation in self.faults.values():
            fresh = wire.fault_record(fault)
            if generation is not None:
                fresh["generation"] = generation
            match = index.get((generation, fresh["source"], fresh["rule"], line_shape(fresh["line"])))
            if match is None:
                merged.append(fresh)
            else:
                match["count"] = int(match.get("count", 1)) + fault.count
        if len(merged) <= wire.MAX_RECORDS:
            return merged
        current = [r for r in merged if r.get("generation") == self.generation][: wire.MAX_RECORDS]
        others = [r for r in merged if r.get("generation") != self.generation]
        kept = others[len(others) - (wire.MAX_RECORDS - len(current)):] if len(current) < wire.MAX_RECORDS else []
        return kept + current

    def annotations(self) -> dict[str, str]:
        """What :meth:`KubeReporter.flush` writes on the pod."""
        written = {POD_FAULTS: json.dumps(self.records(), separators=(",", ":"))}
        if self.status is not None:
            written[POD_STATE] = self.status.encode()
        if self.progress is not None:
            written[PROGRESS] = self.progress.encode()
        if self.times and self.generation is not None:
            written[STEP_TIMES] = wire.StepTimes(self.generation, self.times).encode()
        return written


class KubeReporter:
    def __init__(self, api: client.ApiClient, node: str) -> None:
        self.core = client.CoreV1Api(api)
        self.node = node
        self.pods: dict[str, PodRecord] = {}

    def record_for(self, pod: PodInfo) -> PodRecord:
        record = self.pods.get(pod.uid)
        if record is None:
            earlier: list[dict[str, Any]] = []
            status = progress = None
            try:
                body = self.core.read_namespaced_pod(pod.name, pod.namespace)
                annotations = body.metadata.annotations or {}
                text = annotations.get(POD_FAULTS)
                status = wire.PodStatus.decode(annotations.get(POD_STATE))
                progress = PodProgress.decode(annotations.get(PROGRESS))
                earlier = json.loads(text) if text else []
            except (ApiException, ValueError):
                earlier = []
            record = PodRecord(pod, earlier if isinstance(earlier, list) else [], status, progress)
            self.pods[pod.uid] = record
        return record

    def new_fault(self, pod: PodInfo, fault: Fault) -> None:
        """A fault seen for the first time by this agent: an Event now (unless reported before a restart)."""
        record = self.record_for(pod)
        known = record.known(fault)
        record.merge(fault)
        if known:
            return
        now = _now()
        event = client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name=f"{pod.name}.kcover-", namespace=pod.namespace),
            involved_object=client.V1ObjectReference(kind="Pod", name=pod.name, namespace=pod.namespace,
                                                     uid=pod.uid, api_version="v1"),
            reason="KcoverFault",
            message=f"{fault.category.value} ({fault.rule}): {fault.evidence.line[:900]}",
            type="Warning" if fault.severity is Severity.FATAL else "Normal",
            source=client.V1EventSource(component="kcover-agent", host=self.node),
            reporting_component="kcover.io/agent", reporting_instance=self.node,
            first_timestamp=now, last_timestamp=now, event_time=rfc3339(now, "microseconds"),
            action="Classified", count=1,
        )
        # an Event is best-effort; the durable record (flush) is what the operator reads
        with contextlib.suppress(ApiException):
            self.core.create_namespaced_event(pod.namespace, event)

    def counted(self, pod: PodInfo, fault: Fault) -> None:
        self.record_for(pod).merge(fault)

    def flush(self, force: bool = False) -> int:
        """Write the dirty pod records (rate-limited per pod); returns how many were written."""
        written = 0
        now = time.monotonic()
        for uid, record in list(self.pods.items()):
            if not record.dirty or (not force and now - record.written < WRITE_INTERVAL):
                continue
            patch = {"metadata": {"annotations": record.annotations()}}
            try:
                self.core.patch_namespaced_pod(record.pod.name, record.pod.namespace, patch)
                written += 1
            except ApiException as error:
                if error.status == 404:
                    del self.pods[uid]
                    continue
                raise
            record.dirty = False
            record.written = now
        return written

    def node_unhealthy(self, fault: Fault) -> None:
        """Set ``KcoverHealthy=False`` on this node with the fault as reason."""
        KubeQuarantine(self.core).set_condition(self.node, False, _camel(fault.category.value),
                                                f"{fault.rule}: {fault.evidence.line[:300]}")
