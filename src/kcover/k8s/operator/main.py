"""The operator process: kopf watches pods and jobs; one evaluator acts on the jobs that changed.

kopf keeps resilient watches on pods and on the three job kinds (event
handlers only: kcover adds no finalizers and no bookkeeping to users' objects).
Each event refreshes an in-memory view and marks the job dirty; the evaluator
task, on the replica holding the leader Lease, assesses dirty jobs after a short
settle (so the cascade of pod failures of one incident is judged once, with all
its evidence) and carries the decision out.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any

import kopf
from kubernetes import client

from kcover.classify.rules import Rule
from kcover.decide.policy import DecisionKind
from kcover.explain import default_matcher
from kcover.faults import Role
from kcover.health.quarantine.kube import KubeQuarantine
from kcover.health.quarantine.policy import QuarantinePolicy, Verdict
from kcover.k8s.kinds import BATCH_JOB, JOBSET, KINDS
from kcover.k8s.operator import metrics
from kcover.k8s.operator.actuate import Actuator, Conflict
from kcover.k8s.operator.assess import Assessment, assess, state_to
from kcover.k8s.operator.leader import LeaderElection
from kcover.k8s.operator.policy import GROUP, PLURAL, VERSION, JobPolicy, from_resource, with_annotations
from kcover.k8s.operator.recreate import controlled
from kcover.k8s.operator.views import JobView, PodView, job_view, pod_view, utc_now

log = logging.getLogger("kcover.operator")
SETTLE_SECONDS = 0.3
TICK_SECONDS = 0.1
CAUSE_GRACE_SECONDS = 3.0  # how long cascade-only evidence waits for the agents' report of a cause
RECREATE_POLL = 0.5  # while a replaced Job waits to be created again
RECREATE_SWEEP = 10.0  # otherwise (a leader that died may have left one)


@dataclass
class Config:
    namespace: str = "kcover-system"
    identity: str = "kcover-operator"
    lease_seconds: float = 15.0
    metrics_port: int | None = None


@dataclass
class World:
    """What the watches have shown so far, and which jobs need a look."""

    pods: dict[str, PodView] = field(default_factory=dict)
    jobs: dict[tuple[str, str, str], JobView] = field(default_factory=dict)
    dirty: dict[tuple[str, str, str], float] = field(default_factory=dict)
    warned: set[tuple[tuple[str, str, str], str]] = field(default_factory=set)
    prepared: set[tuple[tuple[str, str, str], int]] = field(default_factory=set)
    failing_since: dict[tuple[str, str, str], float] = field(default_factory=dict)
    recreating: bool = True  # a Job may wait to be created again (set at start: a crash may have left one)

    def pods_of(self, job: JobView) -> list[PodView]:
        return [p for p in self.pods.values() if p.namespace == job.namespace and p.job == (job.kind.kind, job.name)]

    def mark(self, key: tuple[str, str, str]) -> None:
        self.dirty.setdefault(key, time.monotonic())


WORLD = World()
CONFIG = Config()


@kopf.on.startup()
async def _startup(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.posting.enabled = False
    settings.watching.server_timeout = 60
    asyncio.get_running_loop().create_task(_evaluate_forever())


@kopf.on.login()
def _login(**kwargs: Any) -> Any:
    if os.environ.get("KUBECONFIG"):
        return kopf.login_with_kubeconfig(**kwargs)
    return kopf.login_with_service_account(**kwargs)


@kopf.on.event("", "v1", "pods")
def _on_pod(type: str, body: kopf.Body, **_: Any) -> None:
    uid = body.get("metadata", {}).get("uid", "")
    view = pod_view(body, _remediations())
    if type == "DELETED":
        WORLD.pods.pop(uid, None)
    elif view.job is not None:
        WORLD.pods[uid] = view
    if view.job is not None:
        WORLD.mark((view.job[0], view.namespace, view.job[1]))


def _job_handler(kind: str) -> Any:
    def handler(type: str, body: kopf.Body, **_: Any) -> None:
        view = job_view(kind, body)
        if type == "DELETED":
            WORLD.jobs.pop(view.key, None)
            return
        WORLD.jobs[view.key] = view
        if view.opted_in:
            WORLD.mark(view.key)

    return handler


for _kind in KINDS.values():
    kopf.on.event(_kind.group, _kind.version, _kind.plural)(_job_handler(_kind.kind))


# -- evaluation -----------------------------------------------------------------------------------
_RULES: list[Rule] = []


def _rules() -> list[Rule]:
    if not _RULES:
        _RULES.extend(default_matcher().rules)
    return _RULES


def _remediations() -> dict[str, str]:
    return {rule.id: rule.spec.remediation.strip() for rule in _rules()}


async def _evaluate_forever() -> None:
    api = client.ApiClient()
    actuator = Actuator(api, KubeQuarantine(client.CoreV1Api(api)))
    leader = LeaderElection(api, CONFIG.namespace, CONFIG.identity, duration=CONFIG.lease_seconds)
    renewed = swept = 0.0
    while True:
        now = time.monotonic()
        if now - renewed >= CONFIG.lease_seconds / 3 or not leader.leader:
            await asyncio.to_thread(leader.tick)
            renewed = now
        if leader.leader and now - swept >= (RECREATE_POLL if WORLD.recreating else RECREATE_SWEEP):
            swept = now
            try:
                await asyncio.to_thread(_finish_recreations, actuator)
            except Exception:
                log.exception("creating replaced Jobs again failed")
        if leader.leader:
            due = [key for key, since in WORLD.dirty.items() if now - since >= SETTLE_SECONDS]
            for key in due:
                WORLD.dirty.pop(key, None)
                job = WORLD.jobs.get(key)
                if job is None or not job.opted_in:
                    continue
                try:
                    again = await asyncio.to_thread(_evaluate, actuator, job)
                except Conflict:
                    again = True
                except Exception:
                    log.exception("evaluating %s failed", key)
                    again = True
                if again:
                    WORLD.mark(key)
        await asyncio.sleep(TICK_SECONDS)


def _policy(api: client.ApiClient, actuator: Actuator, job: JobView) -> JobPolicy:
    policy = JobPolicy()
    custom = client.CustomObjectsApi(api)
    for namespace in (CONFIG.namespace, job.namespace):
        try:
            body = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "default")
            policy = from_resource(policy, body.get("spec", {}))
        except client.exceptions.ApiException:
            continue
    policy, warnings = with_annotations(policy, job.annotations)
    for reason, found in (("KcoverBadAnnotation", warnings), ("KcoverBadSpec", job.spec_problems)):
        for warning in found:
            if (job.key, warning) not in WORLD.warned:
                WORLD.warned.add((job.key, warning))
                actuator.event(job, reason, warning, warning=True)
    return policy


def _evaluate(actuator: Actuator, job: JobView) -> bool:
    """Assess one job and act; returns True when it should be looked at again soon."""
    recovery = job.recovery()
    if recovery.get("phase") == "failed" or job.finished:
        return False
    policy = _policy(actuator.api, actuator, job)
    if recovery.get("phase") == "restarting":
        return _resume(actuator, job, recovery, policy)
    if job.suspended:
        return False
    assessment = assess(job, WORLD.pods_of(job), _rules(), policy.recovery)
    if not assessment.failed:
        return False
    if _awaiting_cause(job, assessment):
        return True
    WORLD.failing_since.pop(job.key, None)
    return _act(actuator, job, assessment, policy)


def _awaiting_cause(job: JobView, assessment: Assessment) -> bool:
    """Only cascade symptoms so far (exit codes, NCCL errors): give the agents a moment to report the cause.

    Pods' exits reach the operator at once, the agents' record of what the first rank logged up to a
    second later; judging at once would restart without excluding the bad node.
    """
    root = assessment.verdict.root if assessment.verdict else None
    if root is not None and root.role is not Role.CASCADE:
        return False
    since = WORLD.failing_since.setdefault(job.key, time.monotonic())
    return time.monotonic() - since < CAUSE_GRACE_SECONDS


def _act(actuator: Actuator, job: JobView, assessment: Assessment, policy: JobPolicy) -> bool:
    verdict, decision, state = assessment.verdict, assessment.decision, assessment.state
    assert verdict is not None and decision is not None and state is not None
    root = verdict.root
    if root is not None:
        metrics.FAULTS.labels(root.category.value, root.rule).inc()
    log.info("%s %s/%s: %s", job.kind.kind, job.namespace, job.name, decision.reason)
    if decision.kind is DecisionKind.FAIL:
        actuator.fail(job, state_to(state), verdict, decision.reason)
        metrics.FAILED.labels(root.category.value if root else "unknown").inc()
        return False
    not_before = (dt.datetime.now(dt.UTC) + dt.timedelta(seconds=decision.delay)).strftime("%Y-%m-%dT%H:%M:%SZ")
    exclude = decision.excluded if policy.quarantine else ()
    crashed = any(p.phase == "Failed" and p.name in assessment.failing_pods for p in WORLD.pods_of(job))
    method = {BATCH_JOB: "recreate", JOBSET: "renew-children"}.get(job.kind, "native") if crashed else "native"
    recovery = actuator.claim_restart(job, state_to(state), verdict, decision.reason, not_before,
                                      WORLD.pods_of(job), assessment.failing_pods, exclude, method)
    failpoint("after-claim")
    return _resume(actuator, job, recovery, policy, started=time.monotonic())


def _prepare(actuator: Actuator, job: JobView, recovery: dict[str, Any], policy: JobPolicy) -> None:
    """Saga steps 2–3, once per attempt in this process (a new leader replays them; both are idempotent)."""
    attempt = (job.key, int(recovery.get("attempt", 0)))
    if attempt in WORLD.prepared:
        return
    last = recovery.get("last", {})
    actuator.event(job, "KcoverRestart", f"restarting: {last.get('decision', '')}", warning=True)
    actuator.keep_evidence(job, recovery, WORLD.pods_of(job))
    exclude = recovery.get("exclude", [])
    if exclude:
        actuator.quarantine.policy = QuarantinePolicy(max_share=policy.quarantine_max_share)
        for node in exclude:
            result = actuator.quarantine.quarantine(node, last.get("rule") or "fault")
            if result.verdict is Verdict.KEEP:
                continue  # already quarantined (by this restart, before a crash, or by another)
            done = result.verdict is Verdict.QUARANTINE
            if result.verdict is Verdict.REFUSED_BREAKER:
                metrics.BREAKER.inc()
            actuator.event(job, "KcoverQuarantine" if done else "KcoverQuarantineRefused",
                           f"node {node}: {result.reason}", warning=not done)
        metrics.QUARANTINED.set(sum(n.quarantined_by_kcover for n in actuator.quarantine.nodes()))
    WORLD.prepared.add(attempt)


def _resume(actuator: Actuator, job: JobView, recovery: dict[str, Any], policy: JobPolicy,
            started: float | None = None) -> bool:
    """Finish a claimed restart (idempotent): evidence, quarantine, wait out the backoff, stop old pods."""
    if recovery.get("step") != "suspended":
        _prepare(actuator, job, recovery, policy)
    if recovery.get("not_before", "") > utc_now():
        return True
    pods = WORLD.pods_of(job)
    replaced = set(recovery.get("replaced", []))
    if recovery.get("method") == "recreate" and _recreate(actuator, job, recovery, started):
        return False
    if job.kind.restart_by_suspend:
        if recovery.get("step") != "suspended":
            actuator.suspend_for_restart(job, recovery)
            return True
        if any(p.uid in replaced and p.phase not in ("Failed", "Succeeded") for p in pods):
            return True  # the job's controller is still stopping the old pods
        if recovery.get("method") == "renew-children":
            actuator.delete_child_jobs(job)
        deleted = len(replaced)
    else:
        deleted = actuator.delete_pods(pods, list(replaced), policy.grace_period)
    actuator.finish_restart(job, recovery)
    metrics.RESTARTS.labels(job.kind.kind).inc()
    if started is not None:
        metrics.REACTION.observe(time.monotonic() - started)
    log.info("%s %s/%s: restart %s done, %d pods deleted", job.kind.kind, job.namespace, job.name,
             recovery.get("attempt"), deleted)
    return False


def failpoint(name: str) -> None:
    """Die here, as a crash would, when ``KCOVER_OPERATOR_FAILPOINT`` names this point (for crash tests)."""
    if os.environ.get("KCOVER_OPERATOR_FAILPOINT") == name:
        log.warning("failpoint %s: exiting", name)
        os._exit(86)


def _recreate(actuator: Actuator, job: JobView, recovery: dict[str, Any], started: float | None) -> bool:
    """Replace a batch Job whose pods failed (see :mod:`kcover.k8s.operator.recreate`); False: restart natively."""
    body = actuator.recreator.read(job.namespace, job.name)
    if body is None or body["metadata"].get("deletionTimestamp"):
        return True  # on its way out: the pending loop creates it again
    if controlled(body):
        key = (job.key, "controlled")
        if key not in WORLD.warned:
            WORLD.warned.add(key)
            actuator.event(job, "KcoverSlowRestart", "this Job has a controller of its own, so kcover resumes it "
                           "instead of replacing it: the Job controller delays new pods after failures", warning=True)
        return False
    actuator.recreator.save_and_delete(body, recovery)
    failpoint("after-recreate-delete")
    WORLD.recreating = True
    if started is not None:
        metrics.REACTION.observe(time.monotonic() - started)
    log.info("Job %s/%s: restart %s by replacing the Job (its pods failed)", job.namespace, job.name,
             recovery.get("attempt"))
    return True


def _finish_recreations(actuator: Actuator) -> None:
    done, waiting = actuator.recreator.finish_pending()
    for body in done:
        job = job_view(BATCH_JOB.kind, body)
        recovery = job.recovery()
        metrics.RESTARTS.labels(BATCH_JOB.kind).inc()
        log.info("Job %s/%s: restart done, the Job was created again", job.namespace, job.name)
        actuator.event(job, "KcoverRestart", f"created again by kcover: {recovery.get('last', {}).get('decision', '')}"
                       " (earlier kcover events are on the replaced Job)", warning=True)
    WORLD.recreating = waiting > 0


def run(config: Config) -> None:
    """Run the operator until interrupted (``kcover operator``)."""
    CONFIG.__dict__.update(config.__dict__)
    if config.metrics_port:
        from prometheus_client import start_http_server

        start_http_server(config.metrics_port)
    _rules()
    kopf.run(clusterwide=True, standalone=True)
