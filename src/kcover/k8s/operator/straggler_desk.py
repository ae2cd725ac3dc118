"""What the operator does about stragglers: Events, the gauge, the job's record, and a replacement to claim.

:class:`~kcover.k8s.operator.stragglers.StragglerWatch` (pure) says which
ranks became stragglers and which recovered; :class:`StragglerDesk` tells
people — a ``KcoverStraggler`` Event per new straggler, the
``kcover_straggler_slowdown`` gauge, the job's ``kcover.io/stragglers`` — and,
with ``kcover.io/straggler-action: replace``, judges each new straggler and
hands the reconciler the fault to restart the job with (rule ``job.straggler``,
which blames the node) when replacing its node pays.  The reconciler claims
that restart through its ordinary saga, unless the policy's decision would
fail the job or not move the rank (:func:`refusal`): a slow rank is then only
reported.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace
from typing import Protocol

from kcover.classify.rules import Rule
from kcover.decide.policy import Decision, DecisionKind
from kcover.decide.straggler_action import StragglerAction, judge_replace
from kcover.faults import Evidence
from kcover.k8s.names import TOTAL_STEPS
from kcover.k8s.operator import metrics
from kcover.k8s.operator.policy import JobPolicy
from kcover.k8s.operator.record import RecoveryRecord
from kcover.k8s.operator.stragglers import JobKey, StragglerNews, StragglerWatch, encode, replace_case
from kcover.k8s.operator.views import JobView, PodView

log = logging.getLogger("kcover.operator")
STRAGGLER_RULE = "job.straggler"
"""The catalog rule of a straggler whose node is replaced: node at fault, so the policy excludes it."""


class StragglerActions(Protocol):
    """The side effects the desk needs (the reconciler's :class:`JobActions` has them)."""

    def event(self, job: JobView, reason: str, message: str, warning: bool = False) -> None: ...

    def note_stragglers(self, job: JobView, text: str) -> str | None: ...

    def spare_nodes(self, selector: Mapping[str, str], busy: Collection[str]) -> int: ...


class StragglerDesk:
    def __init__(self, actions: StragglerActions, rules: Sequence[Rule]) -> None:
        self.actions = actions
        self.rule = next((r for r in rules if r.id == STRAGGLER_RULE), None)
        self.watch = StragglerWatch()

    def look(self, job: JobView, record: RecoveryRecord, policy: JobPolicy,
             pods: Sequence[PodView]) -> tuple[JobView, tuple[Rule, Evidence] | None]:
        """Feed the job's step times and tell what changed; the job as the record's write left it, and the fault
        to restart it with when a straggler's node is to be replaced (kept until claimed: a claim may conflict)."""
        news = self.watch.look(job, record.attempt, pods)
        if policy.straggler_action is StragglerAction.REPLACE and news.new:
            selector = next((dict(p.node_selector) for p in pods if p.node_selector), {})
            spares = self.actions.spare_nodes(selector, {p.node for p in pods if p.node})
            judged = []
            for flagged in news.new:
                case = replace_case(flagged, pods, job, record, policy.total_steps, spares)
                judgement = judge_replace(case, total_steps_option=TOTAL_STEPS)
                judged.append(self.watch.judged(job.key, replace(flagged, judgement=judgement.reason),
                                                judgement.replace))
            news = replace(news, new=tuple(judged), current=tuple(self.watch.jobs[job.key].flagged.values()))
        job = self.publish(job, news)
        chosen = self.watch.replacing(job.key)
        if chosen is None or self.rule is None:
            return job, None
        return job, (self.rule, Evidence(source=chosen.pod, line=chosen.describe(), rank=chosen.rank,
                                         node=chosen.node, step=chosen.since_step))

    def give_up(self, job: JobView, evidence: Evidence, why: str) -> None:
        """The straggler's node is not replaced after all (:func:`refusal`): it stays reported."""
        self.watch.give_up_replacing(job.key)
        self.actions.event(job, "KcoverStraggler", f"rank {evidence.rank}'s node is not replaced: {why}")

    def publish(self, job: JobView, news: StragglerNews) -> JobView:
        """Stragglers found or recovered: an Event each, the gauge, and the job's record of them; the job as the
        record's write left it (its resourceVersion: a restart claimed next must not conflict with it)."""
        for flagged in news.new:
            log.info("%s %s/%s: %s", job.kind.kind, job.namespace, job.name, flagged.describe())
            self.actions.event(job, "KcoverStraggler", flagged.describe(), warning=True)
        for flagged in news.cleared:
            _remove_gauge(job.namespace, job.name, flagged.node, flagged.rank)
            said = "the job restarted: its straggler watch starts again" if news.restarted else \
                "no longer a straggler"
            self.actions.event(job, "KcoverStragglerRecovered", f"rank {flagged.rank} (node {flagged.node}): {said}")
        for flagged in news.current:
            metrics.STRAGGLER.labels(job.namespace, job.name, flagged.node, str(flagged.rank)).set(flagged.slowdown)
        if not news.changed:
            return job
        version = self.actions.note_stragglers(job, encode(news.current))
        return replace(job, resource_version=version) if version else job

    def finished(self, job: JobView) -> None:
        """A job finished or given up: its stragglers are cleared."""
        self.publish(job, StragglerNews(cleared=self.watch.forget(job.key)))

    def drop_gone(self, present: Collection[JobKey]) -> None:
        """Jobs deleted or opted out: their watches and gauges go too."""
        for (_, namespace, name), flagged in self.watch.gone(present):
            _remove_gauge(namespace, name, flagged.node, flagged.rank)


def refusal(decision: Decision | None, node: str | None, quarantine: bool) -> str:
    """Why a straggler's replacement is not claimed after all ("" when it is): a slow rank never fails a job,
    nor restarts it in vain."""
    if decision is None:
        return "no restart decided"
    if decision.kind is DecisionKind.FAIL:
        return decision.reason
    if node not in decision.excluded or not quarantine:
        return f"a restart would not move it off node {node} (nodes are not excluded for this job)"
    return ""


def _remove_gauge(namespace: str, job: str, node: str, rank: int) -> None:
    with contextlib.suppress(KeyError):
        metrics.STRAGGLER.remove(namespace, job, node, str(rank))
