"""Has this job failed, why, and what now? The operator's pure decision step.

Inputs are plain views (a job, its pods) and the job's
:class:`~kcover.k8s.operator.record.RecoveryRecord`; the output is an :class:`Assessment`:
no failure, or a verdict plus the policy's decision.  Evidence comes from the
agent's fault records on the pods and from each pod's termination state (exit
codes, ``OOMKilled``, ``Evicted``) mapped through the same catalog.  Pods
being deleted, and pods the last restart replaced, are ignored, so one
failure is never acted on twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kcover.classify.attribution import attribute
from kcover.classify.collector import FaultCollector
from kcover.classify.exit_codes import describe_exit, rule_for_exit, rule_for_reason
from kcover.classify.rules import Rule
from kcover.decide.policy import AttemptEnd, Decision, RecoveryPolicy, RecoveryState, decide
from kcover.faults import NO_PROGRESS_RULE, Evidence, Verdict
from kcover.k8s.operator.record import RecoveryRecord
from kcover.k8s.operator.views import JobView, PodView
from kcover.podline import PodState


@dataclass(frozen=True)
class Assessment:
    failed: bool
    verdict: Verdict | None = None
    decision: Decision | None = None
    state: RecoveryState | None = None
    failing_pods: tuple[str, ...] = ()


def current_pods(record: RecoveryRecord, pods: Sequence[PodView]) -> list[PodView]:
    """The pods of the job's current attempt: not being deleted, not replaced by the last restart."""
    replaced = set(record.replaced)
    return [p for p in pods if not p.deleting and p.uid not in replaced]


def _pod_failed(pod: PodView) -> bool:
    """Failed, a container ended badly, a fatal fault, or ``kcover pod`` said a worker failed."""
    worker_failed = pod.status is not None and pod.status.state is PodState.FAILED
    return pod.phase == "Failed" or bool(pod.terminations) or worker_failed or any(f.is_fatal for f in pod.faults)


def evidence(pods: Sequence[PodView], rules: Sequence[Rule]) -> FaultCollector:
    collector = FaultCollector()
    for pod in pods:
        for fault in pod.faults:
            rule = next((r for r in rules if r.id == fault.rule), None)
            if rule is not None:
                collector.add(rule, fault.evidence)
        reasons = [t.reason for t in pod.terminations] + ([pod.reason] if pod.reason else [])
        for reason in reasons:
            by_reason = rule_for_reason(rules, reason)
            if by_reason is not None:
                collector.add(by_reason, Evidence(source=pod.name, line=f"pod {pod.name}: reason {reason}",
                                                  rank=pod.rank, node=pod.node))
        for termination in pod.terminations:
            by_code = rule_for_exit(rules, termination.exit_code)
            if by_code is not None:
                line = f"container {termination.container}: {describe_exit(termination.exit_code)}"
                collector.add(by_code, Evidence(source=pod.name, line=line, rank=pod.rank, node=pod.node))
    return collector


def hung_step(verdict: Verdict) -> int | None:
    """The step a hang verdict stopped at (the agent's evidence carries it), for hang-recurrence checks."""
    if verdict.root is None or verdict.root.rule != NO_PROGRESS_RULE:
        return None
    return verdict.root.evidence.step


def assess(job: JobView, pods: Sequence[PodView], rules: Sequence[Rule], policy: RecoveryPolicy,
           record: RecoveryRecord | None = None, ran_for: float | None = None,
           found: Sequence[tuple[Rule, Evidence]] = ()) -> Assessment:
    """Whether the job's current pods failed, the verdict over all of them, and what the policy decides
    (``ran_for``: seconds since the job's last restart, when there was one; ``found``: faults the operator
    itself found, such as a straggler to replace, each failing the pod its evidence names)."""
    record = record if record is not None else RecoveryRecord.from_annotation(job.recovery_annotation)
    current = current_pods(record, pods)
    named = {evidence.source for _, evidence in found}
    failing = [p for p in current if _pod_failed(p) or p.name in named]
    if not failing:
        return Assessment(failed=False)
    collector = evidence(current, rules)
    for rule, seen in found:
        collector.add(rule, seen)
    # a pod's index is no rank of the job (a pod runs --nproc-per-node ranks), and the agent counts one
    # shape of line once per pod: no silent laggards here, only those the timeout lines prove
    verdict = attribute(collector.faults, ranks_read={})
    nodes = tuple(sorted({p.node for p in current if p.node}))
    decision, new_state = decide(policy, record.state, AttemptEnd(verdict, nodes, hung_step(verdict), ran_for))
    return Assessment(True, verdict, decision, new_state, tuple(p.name for p in failing))
