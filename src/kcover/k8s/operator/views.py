"""Pods and jobs as the operator sees them: small frozen records built from raw API bodies.

kopf hands handlers plain dictionaries; these functions keep every field
access in one place, so the decision code works on typed values and can be
tested without an API server.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kcover.faults import Fault
from kcover.k8s import wire
from kcover.k8s.kinds import KINDS, JobKind, job_of_pod
from kcover.k8s.names import (
    GENERATION,
    OPT_IN_LABEL,
    OPT_IN_VALUE,
    POD_FAULTS,
    POD_STATE,
    PROGRESS,
    RANK,
    RECOVERY,
    STEP_TIMES,
)
from kcover.k8s.progress import PodProgress
from kcover.podline import MAX_GENERATION, PodState
from kcover.timestamps import parse_rfc3339


@dataclass(frozen=True)
class Termination:
    container: str
    exit_code: int
    reason: str
    message: str


@dataclass(frozen=True)
class PodView:
    uid: str
    namespace: str
    name: str
    node: str | None
    phase: str
    reason: str
    deleting: bool
    job: tuple[str, str] | None
    rank: int | None
    terminations: tuple[Termination, ...] = ()
    faults: tuple[Fault, ...] = ()
    """The agent's fault records; with ``kcover pod`` in the pod, those of its current generation only."""
    status: wire.PodStatus | None = None
    """What ``kcover pod`` last reported (None: the pod does not run it, or the agent has not read it yet)."""
    ordered: int | None = None
    """The generation the operator last ordered on this pod (``kcover.io/generation``)."""
    progress: PodProgress | None = None
    """The pod's run as its agent last recorded it (first step, newest checkpoint); None before a step."""

    step_times: wire.StepTimes | None = None
    """The ranks' newest compute seconds per step as the agent last recorded them."""
    node_selector: tuple[tuple[str, str], ...] = ()
    """The pod's ``nodeSelector``: where a replacement could go."""
    assigned: str | None = None
    """What the operator assigned it (``kcover.io/rank``: a rank, ``standby`` or ``done``; jobs with standby)."""

    @property
    def times(self) -> wire.StepTimes | None:
        """The step times of the generation the workers run now."""
        times = self.step_times
        if times is None or self.status is None or times.generation != self.status.generation:
            return None
        return times

    @property
    def run(self) -> PodProgress | None:
        """The progress of the run going on: an earlier generation's is stale once the workers run a new one."""
        progress = self.progress
        if progress is None or progress.generation != (self.status.generation if self.status else None):
            return None
        return progress

    @property
    def stands_by(self) -> bool:
        """A standby job's pod that runs no rank: assigned ``standby`` or ``done``, or says it stands by."""
        return self.assigned in ("standby", "done") or (self.status is not None
                                                        and self.status.state is PodState.STANDBY)

    @property
    def restartable_in_place(self) -> bool:
        """Runs ``kcover pod`` with its generation file, and is neither gone nor going."""
        return (self.status is not None and self.status.in_place and self.phase == "Running"
                and not self.deleting and not self.terminations)


@dataclass(frozen=True)
class JobView:
    kind: JobKind
    namespace: str
    name: str
    uid: str
    resource_version: str
    opted_in: bool
    annotations: Mapping[str, str] = field(default_factory=dict)
    suspended: bool = False
    finished: bool = False
    spec_problems: tuple[str, ...] = ()
    created: float | None = None
    """Epoch seconds of the job's creation."""
    ended: float | None = None
    """Epoch seconds when it finished (None: not finished, or the time is not recorded)."""
    succeeded: bool = False
    """Finished with a success condition (Complete, Succeeded, Completed)."""
    parallelism: int | None = None
    """A batch Job's pods at once (``spec.parallelism``): with standby, its ranks' pods plus the standbys."""

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.kind.kind, self.namespace, self.name)

    @property
    def recovery_annotation(self) -> str | None:
        """The text of ``kcover.io/recovery`` (read it with :class:`~kcover.k8s.operator.record.RecoveryRecord`)."""
        return self.annotations.get(RECOVERY)


def pod_view(body: Mapping[str, Any], remediation: dict[str, str] | None = None) -> PodView:
    meta = body.get("metadata", {})
    spec = body.get("spec", {})
    status = body.get("status", {})
    labels = dict(meta.get("labels") or {})
    annotations = dict(meta.get("annotations") or {})
    owner = job_of_pod(labels)
    terminations = []
    for container in status.get("containerStatuses") or []:
        state = (container.get("state") or {}).get("terminated") or (container.get("lastState") or {}).get(
            "terminated")
        if state and state.get("exitCode", 0) != 0:
            terminations.append(Termination(container.get("name", ""), int(state.get("exitCode", 0)),
                                            state.get("reason") or "", state.get("message") or ""))
    workers = wire.PodStatus.decode(annotations.get(POD_STATE))
    rank_text = annotations.get("batch.kubernetes.io/job-completion-index") or labels.get(
        "training.kubeflow.org/replica-index")
    return PodView(
        uid=meta.get("uid", ""), namespace=meta.get("namespace", ""), name=meta.get("name", ""),
        node=spec.get("nodeName"), phase=status.get("phase", ""), reason=status.get("reason") or "",
        deleting=bool(meta.get("deletionTimestamp")),
        job=(owner[0].kind, owner[1]) if owner else None,
        rank=int(rank_text) if rank_text and rank_text.isdigit() else None,
        terminations=tuple(terminations),
        faults=tuple(wire.decode(annotations.get(POD_FAULTS), remediation, workers.generation if workers else None)),
        status=workers, ordered=_number(annotations.get(GENERATION)),
        progress=PodProgress.decode(annotations.get(PROGRESS)),
        step_times=wire.StepTimes.decode(annotations.get(STEP_TIMES)),
        node_selector=tuple(sorted((str(k), str(v)) for k, v in (spec.get("nodeSelector") or {}).items())),
        assigned=str(annotations[RANK])[:16] if RANK in annotations else None,
    )


def _number(text: str | None) -> int | None:
    if text is None or not text.isdigit() or len(text) > len(str(MAX_GENERATION)):
        return None  # never int() of a huge annotation: beyond 4,300 digits it raises
    return int(text) if int(text) <= MAX_GENERATION else None


def job_view(kind: str, body: Mapping[str, Any]) -> JobView:
    meta = body.get("metadata", {})
    spec = body.get("spec", {})
    status = body.get("status", {})
    labels = meta.get("labels") or {}
    job_kind = KINDS[kind]
    suspended = bool(spec.get("suspend") or (spec.get("runPolicy") or {}).get("suspend"))
    conditions = status.get("conditions") or []
    finishing = [c for c in conditions
                 if c.get("type") in ("Complete", "Succeeded", "Failed", "Completed") and c.get("status") == "True"]
    finished = bool(finishing)
    ended = parse_rfc3339(status.get("completionTime")) or next(
        (moment for c in finishing if (moment := parse_rfc3339(c.get("lastTransitionTime")))), None)
    created = parse_rfc3339(meta.get("creationTimestamp"))
    return JobView(
        kind=job_kind, namespace=meta.get("namespace", ""), name=meta.get("name", ""), uid=meta.get("uid", ""),
        resource_version=meta.get("resourceVersion", ""), opted_in=labels.get(OPT_IN_LABEL) == OPT_IN_VALUE,
        annotations=dict(meta.get("annotations") or {}), suspended=suspended, finished=finished,
        spec_problems=spec_problems(kind, spec), created=created.timestamp() if created else None,
        ended=ended.timestamp() if ended and finished else None,
        succeeded=any(c.get("type") in ("Complete", "Succeeded", "Completed") for c in finishing),
        parallelism=_number(str(spec.get("parallelism"))) if kind == "Job" else None,
    )


def spec_problems(kind: str, spec: Mapping[str, Any]) -> tuple[str, ...]:
    """What in a job's spec stops kcover from restarting it (posted once as a Warning Event)."""
    if kind == "PyTorchJob":
        return tuple(f"replica {name} has restartPolicy Never: the training-operator fails the whole job when "
                     "kcover deletes a pod; use OnFailure or ExitCode"
                     for name, replica in (spec.get("pytorchReplicaSpecs") or {}).items()
                     if (replica or {}).get("restartPolicy") == "Never")
    if kind == "Job":
        rules = (spec.get("podFailurePolicy") or {}).get("rules") or []
        if not any(rule.get("action") == "Ignore" and rule.get("onExitCodes") for rule in rules):
            return (f"no podFailurePolicy rule ignoring non-zero exits: crashed ranks count toward backoffLimit "
                    f"({spec.get('backoffLimit', 6)}) and can end the Job before kcover restarts it",)
    return ()

