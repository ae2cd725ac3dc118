"""The operator's restart saga, as plain code over one seam: what to do with a job that changed.

:class:`Reconciler` holds the steps of recovering a job — assess it, wait a
moment for the agents' report of a cause, claim a restart (or fail fast), keep
the evidence, quarantine the blamed nodes, wait out the backoff, stop the old
pods, finish — and nothing else.  Every side effect goes through
:class:`JobActions` (the Kubernetes implementation is
:class:`~kcover.k8s.operator.actuate.Actuator`) and every time comes from a
:class:`Clock`, so the saga runs in unit tests against a fake of each in
milliseconds, and :mod:`kcover.k8s.operator.main` is only the kopf shell that
feeds it events.

A job whose pods run ``kcover pod`` and whose failure blames no node is
restarted *in place* instead (:mod:`kcover.k8s.operator.inplace`): the claim
names a new generation, the pods are told it, and the restart is done when
every pod runs it — or escalated to a restart of the pods when one cannot.

While a job runs, its pods' step times feed the straggler watch
(:mod:`kcover.k8s.operator.straggler_desk`): a slow rank is reported (an Event,
the ``kcover_straggler_slowdown`` gauge, ``kcover.io/stragglers``) and, with
``kcover.io/straggler-action: replace``, its node replaced through the same
saga when that pays — never a failed job for a slow rank.

The saga's state is the job's :class:`~kcover.k8s.operator.record.RecoveryRecord`;
each step is idempotent and the claim records everything the later steps need,
so a new leader that finds a job ``restarting`` replays the rest exactly once
(:meth:`Reconciler.resume`).
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from kcover.classify.rules import Rule
from kcover.decide.policy import DecisionKind
from kcover.faults import Role
from kcover.health.quarantine.policy import NodeAction, NodeDecision
from kcover.k8s.kinds import BATCH_JOB, JOBSET
from kcover.k8s.operator import inplace, metrics, standby
from kcover.k8s.operator.assess import Assessment, assess, current_pods
from kcover.k8s.operator.policy import JobPolicy, from_resource, with_annotations
from kcover.k8s.operator.record import RecoveryPhase, RecoveryRecord, RestartMethod, RestartStep
from kcover.k8s.operator.recreate import controlled
from kcover.k8s.operator.straggler_desk import StragglerDesk, refusal
from kcover.k8s.operator.views import JobView, PodView, job_view
from kcover.k8s.progress import closed_run

log = logging.getLogger("kcover.operator")
SETTLE_SECONDS = 0.3
FORGET_SECONDS = 600.0  # a deleted job's memories (warnings given, restarts prepared) are kept this long
CAUSE_GRACE_SECONDS = 3.0  # how long cascade-only evidence waits for the agents' report of a cause

JobKey = tuple[str, str, str]


class Conflict(Exception):  # noqa: N818 - a normal outcome, not an error: another replica acted first
    """The job changed since it was read: someone else is acting on it."""


class Clock(Protocol):
    def monotonic(self) -> float: ...

    def now(self) -> dt.datetime: ...


class SystemClock:
    """The real clocks: monotonic for waiting, UTC wall time for what is written on objects."""

    def monotonic(self) -> float:
        return time.monotonic()

    def now(self) -> dt.datetime:
        return dt.datetime.now(dt.UTC)


class JobActions(Protocol):
    """Every side effect of the saga (the seam unit tests fake)."""

    def event(self, job: JobView, reason: str, message: str, warning: bool = False) -> None: ...

    def policy_spec(self, namespace: str) -> dict[str, Any] | None: ...

    def claim(self, job: JobView, record: RecoveryRecord, reason: str) -> None: ...

    def keep_evidence(self, job: JobView, record: RecoveryRecord, pods: Sequence[PodView]) -> None: ...

    def quarantine_node(self, node: str, reason: str, max_share: float) -> NodeDecision: ...

    def quarantined_count(self) -> int: ...

    def suspend_for_restart(self, job: JobView, record: RecoveryRecord) -> None: ...

    def delete_pods(self, pods: Sequence[PodView], replaced: Sequence[str], grace: int) -> int: ...

    def delete_child_jobs(self, job: JobView) -> int: ...

    def finish_restart(self, job: JobView, record: RecoveryRecord) -> None: ...

    def fail(self, job: JobView, record: RecoveryRecord, reason: str) -> None: ...

    def read_job(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    def replace_job(self, body: dict[str, Any], record: RecoveryRecord) -> None: ...

    def finish_replacements(self) -> tuple[list[dict[str, Any]], int]: ...

    def order_generation(self, pods: Sequence[PodView], generation: int, ranks: Mapping[str, int]) -> None: ...

    def assign_ranks(self, pods: Sequence[PodView], values: Mapping[str, str]) -> None: ...

    def write_record(self, job: JobView, record: RecoveryRecord) -> None: ...

    def note_stragglers(self, job: JobView, text: str) -> str | None: ...

    def spare_nodes(self, selector: Mapping[str, str], busy: Collection[str]) -> int: ...


@dataclass
class World:
    """What the watches have shown so far, and which jobs need a look."""

    pods: dict[str, PodView] = field(default_factory=dict)
    jobs: dict[JobKey, JobView] = field(default_factory=dict)
    dirty: dict[JobKey, float] = field(default_factory=dict)
    warned: set[tuple[JobKey, str]] = field(default_factory=set)
    prepared: dict[JobKey, tuple[int, str]] = field(default_factory=dict)  # the newest restart made ready
    failing_since: dict[JobKey, float] = field(default_factory=dict)
    gone: dict[JobKey, float] = field(default_factory=dict)  # deleted jobs, since when
    recreating: bool = True  # a Job may wait to be created again (set at start: a crash may have left one)

    def pods_of(self, job: JobView) -> list[PodView]:
        owner = (job.kind.kind, job.name)
        return [p for p in list(self.pods.values()) if p.namespace == job.namespace and p.job == owner]

    def mark(self, key: JobKey, now: float) -> None:
        self.dirty.setdefault(key, now)

    def job_seen(self, job: JobView) -> None:
        self.jobs[job.key] = job
        self.gone.pop(job.key, None)

    def job_deleted(self, key: JobKey, now: float) -> None:
        self.jobs.pop(key, None)
        self.gone.setdefault(key, now)

    def forget_gone(self, now: float, after: float) -> None:
        """Drop what is remembered of jobs deleted ``after`` seconds ago and not created again since.

        Not at once: a Job replaced by a restart is deleted and created again under its name, and its
        restart must not be prepared twice (a second event, a second copy of the evidence).
        """
        for key in [k for k, since in list(self.gone.items()) if now - since >= after]:
            self.gone.pop(key, None)
            self.prepared.pop(key, None)
            self.failing_since.pop(key, None)
            self.dirty.pop(key, None)
            self.warned = {(k, what) for k, what in self.warned if k != key}


def no_failpoint(_name: str) -> None:
    """The default crash hook: crash tests pass one that exits at a named point."""


class Reconciler:
    """Recovers opted-in jobs: :meth:`evaluate_due` after watch events, :meth:`finish_replacements` periodically."""

    def __init__(self, world: World, actions: JobActions, clock: Clock, rules: Sequence[Rule],
                 namespace: str = "kcover-system", failpoint: Callable[[str], None] = no_failpoint) -> None:
        self.world = world
        self.actions = actions
        self.clock = clock
        self.rules = rules
        self.namespace = namespace
        self.failpoint = failpoint
        self.straggling = StragglerDesk(actions, rules)

    # -- the loop's entry points -----------------------------------------------------------------
    def evaluate_due(self) -> None:
        """Evaluate every job marked dirty at least :data:`SETTLE_SECONDS` ago (a cascade is judged once)."""
        now = self.clock.monotonic()
        self.world.forget_gone(now, FORGET_SECONDS)
        marked = list(self.world.dirty.items())  # one C-level copy: kopf's handlers add marks meanwhile
        self.straggling.drop_gone([key for key, job in list(self.world.jobs.items()) if job.opted_in])
        for key in [k for k, since in marked if now - since >= SETTLE_SECONDS]:
            self.world.dirty.pop(key, None)
            job = self.world.jobs.get(key)
            if job is None or not job.opted_in:
                continue
            try:
                again = self.evaluate(job)
            except Conflict:
                again = True
            except Exception:
                log.exception("evaluating %s failed", key)
                again = True
            if again:
                self.world.mark(key, self.clock.monotonic())

    def evaluate(self, job: JobView) -> bool:
        """Assess one job and act; True when it should be looked at again soon."""
        record = RecoveryRecord.from_annotation(job.recovery_annotation)
        if record.phase is RecoveryPhase.FAILED or job.finished:
            self.straggling.finished(job)
            return False
        policy = self.policy(job)
        self._assign_ranks(job, record, policy)
        if record.phase is RecoveryPhase.RESTARTING:
            return self.resume(job, record, policy)
        if job.suspended:
            return False
        since = (self.clock.now() - record.restarted_at).total_seconds() if record.restarted_at else None
        assessment = assess(job, self.world.pods_of(job), self.rules, policy.recovery, record, since)
        if not assessment.failed:
            self.world.failing_since.pop(job.key, None)  # recovered: a later failure waits for its cause again
            return self._stragglers(job, record, policy, since)
        if self._awaiting_cause(job, assessment):
            return True
        self.world.failing_since.pop(job.key, None)
        return self._act(job, record, assessment, policy)

    def finish_replacements(self) -> None:
        """Create again the batch Jobs a restart deleted (see :mod:`kcover.k8s.operator.recreate`)."""
        done, waiting = self.actions.finish_replacements()
        for body in done:
            job = job_view(BATCH_JOB.kind, body)
            record = RecoveryRecord.from_annotation(job.recovery_annotation)
            metrics.RESTARTS.labels(BATCH_JOB.kind).inc()
            log.info("Job %s/%s: restart done, the Job was created again", job.namespace, job.name)
            decision = record.last.decision if record.last else ""
            self.actions.event(job, "KcoverRestart", f"created again by kcover: {decision}"
                               " (earlier kcover events are on the replaced Job)", warning=True)
        self.world.recreating = waiting > 0

    def _stragglers(self, job: JobView, record: RecoveryRecord, policy: JobPolicy, since: float | None) -> bool:
        """Feed the job's step times; with ``replace``, restart the job without a straggler's node when that pays
        (True: a restart was claimed, look again)."""
        job, found = self.straggling.look(job, record, policy, current_pods(record, self.world.pods_of(job)))
        if found is None:
            return False
        assessment = assess(job, self.world.pods_of(job), self.rules, policy.recovery, record, since, found=[found])
        why_not = refusal(assessment.decision, found[1].node, policy.quarantine)
        if why_not:
            self.straggling.give_up(job, found[1], why_not)
            return False
        return self._act(job, record, assessment, policy)

    # -- policy ----------------------------------------------------------------------------------
    def policy(self, job: JobView) -> JobPolicy:
        """Defaults, then the cluster's and the namespace's RecoveryPolicy, then the job's annotations."""
        policy = JobPolicy()
        for namespace in (self.namespace, job.namespace):
            spec = self.actions.policy_spec(namespace)
            if spec is not None:
                policy = from_resource(policy, spec)
        policy, warnings = with_annotations(policy, job.annotations)
        for reason, found in (("KcoverBadAnnotation", warnings), ("KcoverBadSpec", job.spec_problems)):
            for warning in found:
                self._warn_once(job, warning, reason, warning)
        return policy

    def _assign_ranks(self, job: JobView, record: RecoveryRecord, policy: JobPolicy) -> None:
        """A standby job's new pods get a rank or ``standby``, its standbys ``done`` at the end
        (:mod:`~kcover.k8s.operator.standby`); ranks a standby restart hands over are not given twice."""
        if policy.standby <= 0:
            return
        ranks = standby.ranks_of(job, policy)
        if ranks is None:
            message = (f"kcover.io/standby={policy.standby} ignored: it needs a batch Job whose parallelism is more "
                       f"than its standby pods (parallelism: {job.parallelism})")
            self._warn_once(job, "standby", "KcoverBadAnnotation", message)
            return
        handed = {rank for _, rank in record.takeover} if record.phase is RecoveryPhase.RESTARTING else set()
        pods = self.world.pods_of(job)
        values = standby.assignments(pods, ranks, handed)
        if values:
            self.actions.assign_ranks(pods, values)

    def _warn_once(self, job: JobView, key: str, reason: str, message: str) -> None:
        if (job.key, key) not in self.world.warned:
            self.world.warned.add((job.key, key))
            self.actions.event(job, reason, message, warning=True)

    # -- the saga --------------------------------------------------------------------------------
    def _awaiting_cause(self, job: JobView, assessment: Assessment) -> bool:
        """Only cascade symptoms so far (exit codes, NCCL errors): give the agents a moment to report the cause.

        Pods' exits reach the operator at once, the agents' record of what the first rank logged up to a
        second later; judging at once would restart without excluding the bad node.
        """
        root = assessment.verdict.root if assessment.verdict else None
        if root is not None and root.role is not Role.CASCADE:
            return False
        since = self.world.failing_since.setdefault(job.key, self.clock.monotonic())
        return self.clock.monotonic() - since < CAUSE_GRACE_SECONDS

    def _act(self, job: JobView, record: RecoveryRecord, assessment: Assessment, policy: JobPolicy) -> bool:
        """Step 1: fail fast, or claim a restart and carry it on."""
        verdict, decision, state = assessment.verdict, assessment.decision, assessment.state
        assert verdict is not None and decision is not None and state is not None
        root = verdict.root
        if root is not None:
            metrics.FAULTS.labels(root.category.value, root.rule).inc()
        log.info("%s %s/%s: %s", job.kind.kind, job.namespace, job.name, decision.reason)
        pods = self.world.pods_of(job)
        current = current_pods(record, pods)
        now = self.clock.now()
        since = record.restarted_at.timestamp() if record.restarted_at else job.created
        run = closed_run([p.run for p in current], since, now.timestamp())
        began = dt.datetime.fromtimestamp(job.created, dt.UTC) if job.created is not None else None
        if decision.kind is DecisionKind.FAIL:
            self.actions.fail(job, record.failed(state, verdict, decision.reason, now, run, began), decision.reason)
            metrics.FAILED.labels(root.category.value if root else "unknown").inc()
            return False
        choice = inplace.choose(current, verdict, decision.excluded, record, policy)
        if standby.ranks_of(job, policy) is not None:
            choice = standby.choose(current, verdict, decision.excluded, record, policy) or choice
        method = (RestartMethod.STANDBY if choice.order and choice.order.takeover else RestartMethod.IN_PLACE
                  if choice.order else self._method(job, pods, assessment.failing_pods))
        claimed = record.claimed(
            state, verdict, decision.reason, now, decision.delay, replaced=[p.uid for p in pods],
            failing=assessment.failing_pods, quarantine=decision.excluded if policy.quarantine else (),
            method=method, why=choice.why, in_place=choice.order, run=run, began=began,
        )
        self.actions.claim(job, claimed, decision.reason)
        self.failpoint("after-claim")
        return self.resume(job, claimed, policy, started=self.clock.monotonic())

    @staticmethod
    def _method(job: JobView, pods: Sequence[PodView], failing: Sequence[str]) -> RestartMethod:
        """Pods that crashed make a batch Job's or JobSet's controller back off: those are renewed instead."""
        crashed = any(p.phase == "Failed" and p.name in failing for p in pods)
        if not crashed:
            return RestartMethod.NATIVE
        return {BATCH_JOB: RestartMethod.RECREATE, JOBSET: RestartMethod.RENEW_CHILDREN}.get(
            job.kind, RestartMethod.NATIVE)

    def _prepare(self, job: JobView, record: RecoveryRecord, policy: JobPolicy) -> None:
        """Steps 2–3, once per claimed restart in this process (a new leader replays them; both are idempotent).
        A claim is known by its time too: a job submitted again under the same name counts its attempts anew."""
        attempt = (record.attempt, str(record.restarted_at))
        if self.world.prepared.get(job.key) == attempt:
            return
        decision = record.last.decision if record.last else ""
        how = f" ({record.why})" if record.why else ""
        self.actions.event(job, "KcoverRestart", f"restarting: {decision}{how}", warning=True)
        self.actions.keep_evidence(job, record, self.world.pods_of(job))
        if record.quarantine:
            rule = (record.last.rule if record.last else None) or "fault"
            for node in record.quarantine:
                self._quarantine(job, node, rule, policy)
            metrics.QUARANTINED.set(self.actions.quarantined_count())
        self.world.prepared[job.key] = attempt

    def _quarantine(self, job: JobView, node: str, rule: str, policy: JobPolicy) -> None:
        result = self.actions.quarantine_node(node, rule, policy.quarantine_max_share)
        if result.action is NodeAction.KEEP:
            return  # already quarantined (by this restart, before a crash, or by another)
        done = result.action is NodeAction.QUARANTINE
        if result.action is NodeAction.REFUSED_BREAKER:
            metrics.BREAKER.inc()
        self.actions.event(job, "KcoverQuarantine" if done else "KcoverQuarantineRefused",
                           f"node {node}: {result.reason}", warning=not done)

    def resume(self, job: JobView, record: RecoveryRecord, policy: JobPolicy, started: float | None = None) -> bool:
        """Finish a claimed restart (idempotent): evidence, quarantine, wait out the backoff, stop old pods."""
        if record.step is not RestartStep.SUSPENDED:
            self._prepare(job, record, policy)
        if not record.due(self.clock.now()):
            return True
        if record.method in (RestartMethod.IN_PLACE, RestartMethod.STANDBY):
            return self._resume_in_place(job, record, policy, started)
        if record.method is RestartMethod.RECREATE and self._replace(job, record, started):
            return False
        pods = self.world.pods_of(job)
        if job.kind.restart_by_suspend:
            if record.step is not RestartStep.SUSPENDED:
                self.actions.suspend_for_restart(job, record.suspended())
                return True
            if any(p.uid in record.replaced and p.phase not in ("Failed", "Succeeded") for p in pods):
                return True  # the job's controller is still stopping the old pods
            if self._crashed_meanwhile(job, record, pods) and self._replace(
                    job, replace(record, method=RestartMethod.RECREATE), started):
                return False
            if record.method is RestartMethod.RENEW_CHILDREN:
                self.actions.delete_child_jobs(job)
            deleted = len(record.replaced)
        else:
            deleted = self.actions.delete_pods(pods, record.replaced, policy.grace_period)
        self.actions.finish_restart(job, record.completed())
        metrics.RESTARTS.labels(job.kind.kind).inc()
        if started is not None:
            metrics.REACTION.observe(self.clock.monotonic() - started)
        log.info("%s %s/%s: restart %s done, %d pods deleted", job.kind.kind, job.namespace, job.name,
                 record.attempt, deleted)
        return False

    def _resume_in_place(self, job: JobView, record: RecoveryRecord, policy: JobPolicy, started: float | None) -> bool:
        """Order the new generation on the pods, then wait until every pod runs it (or escalate)."""
        pods = self.world.pods_of(job)
        problem = inplace.trouble(record, pods, policy, self.clock.now())
        if problem is not None:
            return self._escalate(job, record, policy, pods, problem, started)
        if record.step is not RestartStep.ORDERED:
            if record.replaced:  # a standby restart: the blamed node's pods go first (their ranks are handed over)
                self.actions.delete_pods(pods, record.replaced, policy.grace_period)
            self.actions.order_generation([p for p in pods if p.uid in record.in_place_pods], record.generation,
                                          dict(record.takeover))
            self.failpoint("after-order")
            self.actions.write_record(job, record.ordered(self.clock.now()))
            return True
        if not inplace.arrived(record, pods):
            return True
        self.actions.finish_restart(job, record.completed())
        metrics.RESTARTS.labels(job.kind.kind).inc()
        metrics.IN_PLACE.labels(record.method.value, "done").inc()
        if started is not None:
            metrics.REACTION.observe(self.clock.monotonic() - started)
        took = (self.clock.now() - record.restarted_at).total_seconds() if record.restarted_at else 0.0
        handed = ", ".join(f"rank {rank}" for _, rank in record.takeover)
        how = f"restarted with warm standby ({handed} taken over)" if handed else "restarted in place"
        self.actions.event(job, "KcoverRestart", f"{how}: generation {record.generation} runs in "
                           f"{len(record.in_place_pods)} pods, {took:.1f}s after the decision")
        log.info("%s %s/%s: restart %s done in place (generation %s)", job.kind.kind, job.namespace, job.name,
                 record.attempt, record.generation)
        return False

    def _escalate(self, job: JobView, record: RecoveryRecord, policy: JobPolicy, pods: Sequence[PodView],
                  problem: str, started: float | None) -> bool:
        """An in-place restart that cannot finish: restart the pods instead (same attempt, no second backoff)."""
        current = [p for p in pods if not p.deleting]
        method = self._method(job, current, [p.name for p in current])
        escalated = record.escalated([p.uid for p in current], method, f"pods restarted: {problem}",
                                     self.clock.now())
        self.actions.write_record(job, escalated)
        metrics.IN_PLACE.labels(record.method.value, "escalated").inc()
        self.actions.event(job, "KcoverInPlaceEscalated", f"restarting the pods instead: {problem}", warning=True)
        log.info("%s %s/%s: in-place restart escalated: %s", job.kind.kind, job.namespace, job.name, problem)
        return self.resume(job, escalated, policy, started)

    @staticmethod
    def _crashed_meanwhile(job: JobView, record: RecoveryRecord, pods: Sequence[PodView]) -> bool:
        """A batch Job claimed before its pods were seen failing (a real kubelet reports a crash a moment after
        the fault line the agent read) with a pod that then failed by itself (Failed, not being deleted: the
        pods the suspension stops are): resuming it would meet the Job controller's failure backoff (10 s, 20 s,
        … per restart, measured on real nodes), so it is replaced after all."""
        return (job.kind == BATCH_JOB and record.method is RestartMethod.NATIVE
                and any(p.uid in record.replaced and p.phase == "Failed" and not p.deleting for p in pods))

    def _replace(self, job: JobView, record: RecoveryRecord, started: float | None) -> bool:
        """Replace a batch Job whose pods failed; False: it has a controller of its own, so restart natively."""
        body = self.actions.read_job(job.namespace, job.name)
        if body is None or body["metadata"].get("deletionTimestamp"):
            return True  # on its way out: the pending loop creates it again
        if controlled(body):
            self._warn_once(job, "controlled", "KcoverSlowRestart", "this Job has a controller of its own, so "
                            "kcover resumes it instead of replacing it: the Job controller delays new pods after "
                            "failures")
            return False
        self.actions.replace_job(body, record.completed())
        self.failpoint("after-recreate-delete")
        self.world.recreating = True
        if started is not None:
            metrics.REACTION.observe(self.clock.monotonic() - started)
        log.info("Job %s/%s: restart %s by replacing the Job (its pods failed)", job.namespace, job.name,
                 record.attempt)
        return True
