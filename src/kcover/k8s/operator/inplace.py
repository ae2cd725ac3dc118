"""Restarting a job's workers in place: whether to, and whether it worked (pure: views in, answers out).

A job whose pods run ``kcover pod`` (:mod:`kcover.launcher.pod`) can be restarted
without touching a pod: the operator writes a new *generation* on every pod,
each pod's kcover stops its workers and starts them again, and the ranks meet
in a fresh rendezvous.  That is worth doing only when no node is to blame — a
node at fault must lose its pod — and only when every pod can: :func:`choose`
says which, and why, in words the operator records and posts.  A failure
that makes no progress past the last in-place restart's step (the same crash
again) restarts the pods instead.

While the order is out, :func:`trouble` names what makes it fail — a pod gone,
no longer running, failed again in the new generation, or the time allowed
passed — and :func:`arrived` says when every pod runs the new generation.
Either way the operator moves on: finished, or escalated to a restart of the
pods (the same attempt, no second backoff).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

from kcover.faults import Verdict
from kcover.k8s.operator.policy import JobPolicy
from kcover.k8s.operator.record import InPlaceOrder, RecoveryRecord
from kcover.k8s.operator.views import PodView
from kcover.podline import PodState


@dataclass(frozen=True)
class Choice:
    """In place (with the order) or not, and why."""

    order: InPlaceOrder | None
    why: str


def failure_step(pods: Sequence[PodView], verdict: Verdict) -> int | None:
    """The newest step the job reached before this failure: the pods' reports, else the hang's step."""
    steps = [p.status.step for p in pods if p.status is not None and p.status.step is not None]
    if steps:
        return max(steps)
    return verdict.root.evidence.step if verdict.root is not None else None


def blamed_on_job(pods: Sequence[PodView], verdict: Verdict, excluded: Sequence[str]) -> tuple[str, ...]:
    """The job's nodes the failure blames: those excluded, else the verdict's nodes that run a pod of the job.

    A log line may name any node (Slurm's "Node failure on gpu-77"); one that runs none of
    the job's pods is not the job's to move away from.
    """
    if excluded:
        return tuple(excluded)
    mine = {p.node for p in pods if p.node}
    return tuple(node for node in verdict.nodes if node in mine)


def choose(pods: Sequence[PodView], verdict: Verdict, excluded: Sequence[str], record: RecoveryRecord,
           policy: JobPolicy) -> Choice:
    """Whether the failure of a job with these current pods is restarted in place (standby pods, which run no
    rank, take no part)."""
    pods = [p for p in pods if not p.stands_by]
    if not policy.in_place:
        return Choice(None, "pods restarted: in-place restart is off for this job")
    blamed = blamed_on_job(pods, verdict, excluded)
    if blamed or (verdict.node_at_fault and not verdict.nodes):
        return Choice(None, f"pods restarted: {', '.join(blamed) or 'a node'} is blamed, its pod must move")
    if not pods:
        return Choice(None, "pods restarted: the job has no running pod")
    without = [p.name for p in pods if not p.restartable_in_place]
    if without:
        return Choice(None, f"pods restarted: {_names(without)} cannot restart in place (no kcover pod with a "
                            "generation file, or not running)")
    step = failure_step(pods, verdict)
    previous = record.in_place_step
    if previous is not None and (step or 0) <= previous:
        return Choice(None, f"pods restarted: failed again at step {step if step is not None else 'unknown'}, "
                            f"no further than the in-place restart after step {previous}")
    generation = max([record.generation, *(p.status.generation for p in pods if p.status is not None)]) + 1
    return Choice(InPlaceOrder(generation, tuple(p.uid for p in pods), step),
                  f"in place: no node blamed, {len(pods)} pods run kcover pod")


def trouble(record: RecoveryRecord, pods: Sequence[PodView], policy: JobPolicy, now: dt.datetime) -> str | None:
    """Why an in-place restart under way cannot finish, or None while it still can."""
    by_uid = {p.uid: p for p in pods}
    for uid in record.in_place_pods:
        pod = by_uid.get(uid)
        if pod is None or pod.deleting:
            return "a pod of the job went away during the in-place restart"
        finished = pod.status is not None and pod.status.generation >= record.generation and (
            pod.status.state is PodState.DONE)
        if not pod.restartable_in_place and not finished:
            return f"pod {pod.name} stopped running during the in-place restart"
        status = pod.status
        if status is not None and status.generation >= record.generation and status.state is PodState.FAILED:
            return f"pod {pod.name} failed again in generation {status.generation}"
    if record.ordered_at is not None:
        waited = (now - record.ordered_at).total_seconds()
        if waited > policy.in_place_timeout:
            return (f"generation {record.generation} not running in every pod after {waited:.0f}s "
                    f"(limit {policy.in_place_timeout:g}s)")
    return None


def arrived(record: RecoveryRecord, pods: Sequence[PodView]) -> bool:
    """Every ordered pod runs the new generation (or has already finished in it)."""
    by_uid = {p.uid: p for p in pods}
    for uid in record.in_place_pods:
        status = by_uid[uid].status if uid in by_uid else None
        if status is None or status.generation < record.generation or status.state not in (PodState.RUNNING,
                                                                                            PodState.DONE):
            return False
    return True


def _names(names: Sequence[str]) -> str:
    shown = ", ".join(names[:5])
    return shown + (f" and {len(names) - 5} more" if len(names) > 5 else "")
