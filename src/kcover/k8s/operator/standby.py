"""Warm standby pods: which pod runs which rank, and a blamed node's ranks handed to standbys (pure).

A batch Job with ``kcover.io/standby: "S"`` runs S more pods than its ranks
need (``parallelism`` = the ranks' pods + S), every one under ``kcover pod
--assigned-rank``, which waits warm until its ``kcover.io/rank`` names a rank
(:mod:`kcover.launcher.pod_files`).  The operator writes that annotation:

- :func:`assignments` gives a new pod the rank of its completion index when no
  live pod holds that rank, else ``standby``; once every rank's pod has
  succeeded, the standbys get ``done`` and end with success, so the Job
  completes.
- :func:`choose` — for a failure that blames a node — hands the rank of each
  pod on a blamed node to an idle standby on another node: those pods are
  deleted (the Job controller's replacements for them become the new
  standbys: the standby pool refills itself), the standbys are ordered the
  rank with the new generation, and every other rank's pod restarts in place.
  When that cannot be done (too few idle standbys, a pod that cannot restart in
  place), it says why and the pods are restarted as without standby.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from kcover.faults import Verdict
from kcover.k8s.operator.inplace import Choice, blamed_on_job, failure_step
from kcover.k8s.operator.policy import JobPolicy
from kcover.k8s.operator.record import InPlaceOrder, RecoveryRecord
from kcover.k8s.operator.views import JobView, PodView
from kcover.podline import PodState

STANDBY = "standby"
DONE = "done"
LIVE = ("Pending", "Running")


def ranks_of(job: JobView, policy: JobPolicy) -> int | None:
    """How many of the job's pods run ranks; None when it has no standby, or its size cannot be told."""
    if policy.standby <= 0 or job.parallelism is None or job.parallelism <= policy.standby:
        return None
    return job.parallelism - policy.standby


def held_rank(pod: PodView) -> int | None:
    """The rank the operator assigned this pod, if any."""
    text = pod.assigned
    return int(text) if text is not None and text.isdigit() and len(text) <= 7 else None


def idle(pod: PodView) -> bool:
    """A standby ready to take a rank: running, its ``kcover pod`` waiting, not on its way out."""
    return (pod.assigned == STANDBY and pod.status is not None and pod.status.state is PodState.STANDBY
            and pod.phase == "Running" and not pod.deleting)


def assignments(pods: Sequence[PodView], ranks: int, handed: Collection[int] = ()) -> dict[str, str]:
    """The ``kcover.io/rank`` to write on pods that need one now (uid → value); others keep theirs.

    ``handed``: ranks a standby restart under way is handing to standbys (held, though no pod says so yet).
    """
    holders = [p for p in pods if held_rank(p) is not None and not p.deleting and p.phase in (*LIVE, "Succeeded")]
    held = {held_rank(p) for p in holders} | set(handed)
    finished = {held_rank(p) for p in holders if p.phase == "Succeeded"}
    written: dict[str, str] = {}
    if finished >= set(range(ranks)):
        return {p.uid: DONE for p in pods if p.assigned != DONE and held_rank(p) is None and not p.deleting
                and p.phase in LIVE}
    for pod in sorted(pods, key=lambda p: (p.rank if p.rank is not None else ranks, p.name)):
        if pod.assigned is not None or pod.deleting or pod.phase not in LIVE:
            continue
        if pod.rank is not None and pod.rank < ranks and pod.rank not in held:
            held.add(pod.rank)
            written[pod.uid] = str(pod.rank)
        else:
            written[pod.uid] = STANDBY
    return written


def choose(pods: Sequence[PodView], verdict: Verdict, excluded: Sequence[str], record: RecoveryRecord,
           policy: JobPolicy) -> Choice | None:
    """Hand the blamed nodes' ranks to standbys; None when no node is blamed (the in-place choice stands)."""
    blamed = set(blamed_on_job(pods, verdict, excluded))
    if not blamed or not policy.in_place:
        return None
    going = [p for p in pods if p.node in blamed and not p.deleting]
    lost = [p for p in going if held_rank(p) is not None]
    named = ", ".join(sorted(blamed))
    if not lost:
        return Choice(None, f"pods restarted: {named} is blamed but runs no rank's pod")
    ready = sorted((p for p in pods if idle(p) and p.node not in blamed), key=lambda p: p.name)
    if len(ready) < len(lost):
        return Choice(None, f"pods restarted: {named} is blamed; {len(lost)} rank(s) to hand over, "
                            f"{len(ready)} standby pod(s) ready")
    others = [p for p in pods if held_rank(p) is not None and p not in lost and not p.deleting]
    stuck = [p.name for p in others if not p.restartable_in_place]
    if stuck:
        return Choice(None, f"pods restarted: {named} is blamed; {', '.join(stuck[:5])} cannot restart in place")
    handed = tuple((standby.uid, held_rank(pod) or 0) for pod, standby in zip(lost, ready, strict=False))
    ordered = [*others, *ready[: len(lost)]]
    generation = max([record.generation, *(p.status.generation for p in pods if p.status is not None)]) + 1
    ranks = ", ".join(str(rank) for _, rank in handed)
    return Choice(InPlaceOrder(generation, tuple(p.uid for p in ordered), failure_step(others, verdict),
                               dropped=tuple(p.uid for p in going), takeover=handed),
                  f"standby: {named} blamed, rank(s) {ranks} taken over by standby pod(s) "
                  f"{', '.join(p.name for p in ready[: len(lost)])}, {len(others)} pod(s) restarted in place")
