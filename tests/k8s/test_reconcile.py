"""The operator's restart saga without a cluster: the reconciler against a fake of its one seam and a fake clock.

Each test plays what the API server would show (jobs and pods in the world, the
record the last patch wrote) and checks what the reconciler asked for, step by
step: claim, evidence, quarantine, backoff, stop, finish — and the replays a
new leader does.  The end-to-end tests in ``test_recovery_e2e.py`` run the same
saga on the real control plane.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import pytest

from kcover import explain
from kcover.classify.matcher import default_matcher
from kcover.decide.policy import PastFailure
from kcover.faults import Category
from kcover.health.quarantine.policy import NodeAction, NodeDecision
from kcover.k8s import wire
from kcover.k8s.names import RECOVERY
from kcover.k8s.operator.reconcile import (
    CAUSE_GRACE_SECONDS,
    FORGET_SECONDS,
    SETTLE_SECONDS,
    Conflict,
    Reconciler,
    World,
)
from kcover.k8s.operator.record import RecoveryPhase, RecoveryRecord, RestartMethod, RestartStep
from kcover.k8s.operator.views import JobView, PodView, job_view, pod_view

XID = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python, GPU has fallen off the bus."
NCCL = ("[rank1]: torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, "
        "remote process exited or there was a network error, NCCL version 2.20.5")
KEYERROR = "Traceback (most recent call last):\nKeyError: 'labels'"


class FakeClock:
    def __init__(self) -> None:
        self.mono = 1000.0
        self.wall = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)

    def monotonic(self) -> float:
        return self.mono

    def now(self) -> dt.datetime:
        return self.wall

    def advance(self, seconds: float) -> None:
        self.mono += seconds
        self.wall += dt.timedelta(seconds=seconds)


class FakeActions:
    """Records every call, and writes records and suspends into the world as the API server would."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.calls: list[tuple[str, Any]] = []
        self.conflict = False
        self.quarantined: set[str] = set()
        self.bodies: dict[tuple[str, str], dict[str, Any]] = {}
        self.pending: list[dict[str, Any]] = []
        self.spares = 1

    def _write(self, job: JobView, record: RecoveryRecord, suspended: bool | None = None) -> None:
        current = self.world.jobs.get(job.key, job)
        annotations = {**current.annotations, RECOVERY: record.to_annotation()}  # a merge patch
        self.world.jobs[job.key] = dataclasses.replace(
            current, annotations=annotations, suspended=current.suspended if suspended is None else suspended,
            resource_version=str(int(current.resource_version or "0") + 1))

    def event(self, job: JobView, reason: str, message: str, warning: bool = False) -> None:
        self.calls.append(("event", reason))

    def policy_spec(self, namespace: str) -> dict[str, Any] | None:
        return None

    def claim(self, job: JobView, record: RecoveryRecord, reason: str) -> None:
        current = self.world.jobs.get(job.key, job)
        if self.conflict or current.resource_version != job.resource_version:  # a conditional patch
            raise Conflict("changed")
        self.calls.append(("claim", record.attempt))
        self._write(job, record)

    def keep_evidence(self, job: JobView, record: RecoveryRecord, pods: Sequence[PodView]) -> None:
        self.calls.append(("evidence", record.attempt))

    def quarantine_node(self, node: str, reason: str, max_share: float) -> NodeDecision:
        self.calls.append(("quarantine", node))
        if node in self.quarantined:
            return NodeDecision(NodeAction.KEEP, "already quarantined by kcover")
        self.quarantined.add(node)
        return NodeDecision(NodeAction.QUARANTINE, reason)

    def quarantined_count(self) -> int:
        return len(self.quarantined)

    def suspend_for_restart(self, job: JobView, record: RecoveryRecord) -> None:
        self.calls.append(("suspend", record.step))
        self._write(job, record, suspended=True)

    def delete_pods(self, pods: Sequence[PodView], replaced: Sequence[str], grace: int) -> int:
        self.calls.append(("delete_pods", grace))
        return len(replaced)

    def delete_child_jobs(self, job: JobView) -> int:
        self.calls.append(("delete_child_jobs", job.name))
        return 1

    def finish_restart(self, job: JobView, record: RecoveryRecord) -> None:
        self.calls.append(("finish", record.phase))
        self._write(job, record, suspended=False)

    def fail(self, job: JobView, record: RecoveryRecord, reason: str) -> None:
        self.calls.append(("fail", reason))
        self._write(job, record, suspended=True)

    def read_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.bodies.get((namespace, name))

    def replace_job(self, body: dict[str, Any], record: RecoveryRecord) -> None:
        self.calls.append(("replace", record.phase))
        body["metadata"]["deletionTimestamp"] = "now"

    def finish_replacements(self) -> tuple[list[dict[str, Any]], int]:
        done, self.pending = self.pending, []
        return done, 0

    def spare_nodes(self, selector: Mapping[str, str], busy: Collection[str]) -> int:
        self.calls.append(("spare_nodes", len(busy)))
        return self.spares

    def note_stragglers(self, job: JobView, text: str) -> str | None:
        self.calls.append(("stragglers", text))
        current = self.world.jobs.get(job.key, job)
        version = str(int(current.resource_version or "0") + 1)
        self.world.jobs[job.key] = dataclasses.replace(current, resource_version=version, annotations={
            **current.annotations, "kcover.io/stragglers": text})
        return version

    def order_generation(self, pods: Sequence[PodView], generation: int, ranks: Mapping[str, int]) -> None:
        self.calls.append(("order", generation))
        for pod in pods:
            if pod.uid in self.world.pods:
                assigned = str(ranks[pod.uid]) if pod.uid in ranks else self.world.pods[pod.uid].assigned
                self.world.pods[pod.uid] = dataclasses.replace(self.world.pods[pod.uid], ordered=generation,
                                                               assigned=assigned)

    def assign_ranks(self, pods: Sequence[PodView], values: Mapping[str, str]) -> None:
        self.calls.append(("assign", dict(sorted((p.name, values[p.uid]) for p in pods if p.uid in values))))
        for pod in pods:
            if pod.uid in values and pod.uid in self.world.pods:
                self.world.pods[pod.uid] = dataclasses.replace(self.world.pods[pod.uid], assigned=values[pod.uid])

    def write_record(self, job: JobView, record: RecoveryRecord) -> None:
        self.calls.append(("record", record.step))
        self._write(job, record)

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]


def fake_reconciler(clock: FakeClock | None = None, failpoint: Any = None) -> tuple[Reconciler, FakeActions]:
    world = World()
    actions = FakeActions(world)
    kwargs = {"failpoint": failpoint} if failpoint else {}
    return Reconciler(world, actions, clock or FakeClock(), default_matcher().rules, **kwargs), actions


def job_body(kind: str = "Job", recovery: RecoveryRecord | None = None, name: str = "train") -> dict[str, Any]:
    annotations = {RECOVERY: recovery.to_annotation()} if recovery else {}
    spec = {"podFailurePolicy": {"rules": [{"action": "Ignore", "onExitCodes": {"operator": "NotIn",
                                                                                "values": [0]}}]}}
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "resourceVersion": "1",
                         "labels": {"kcover.io/cascading-recovery": "true"}, "annotations": annotations},
            "spec": spec if kind == "Job" else {}}


def pod_body(name: str, text: str, node: str, phase: str = "Running", kind_label: str = "batch.kubernetes.io/job-name",
             ) -> dict[str, Any]:
    faults = [dataclasses.replace(f, evidence=dataclasses.replace(f.evidence, node=node))  # as the agent records
              for f in (explain(text, source=name).faults if text else [])]
    return {"metadata": {"uid": f"uid-{name}", "namespace": "ns", "name": name,
                         "labels": {kind_label: "train"}, "annotations": {"kcover.io/faults": wire.encode(faults)}},
            "spec": {"nodeName": node}, "status": {"phase": phase}}


def put(reconciler: Reconciler, job: JobView, *pods: PodView) -> JobView:
    reconciler.world.jobs[job.key] = job
    for pod in pods:
        reconciler.world.pods[pod.uid] = pod
    return job


def current(reconciler: Reconciler, job: JobView) -> tuple[JobView, RecoveryRecord]:
    fresh = reconciler.world.jobs[job.key]
    return fresh, RecoveryRecord.from_annotation(fresh.recovery_annotation)


def xid_job(reconciler: Reconciler, phase: str = "Running") -> JobView:
    return put(reconciler, job_view("Job", job_body()), pod_view(pod_body("p0", XID, "n0", phase)),
               pod_view(pod_body("p1", NCCL, "n1", phase)))


def test_a_gpu_fault_restarts_the_job_without_its_node_step_by_step() -> None:
    reconciler, actions = fake_reconciler()
    job = xid_job(reconciler)
    assert reconciler.evaluate(job), "suspended: look again once the old pods are gone"
    assert actions.names() == ["claim", "event", "evidence", "quarantine", "event", "suspend"]
    assert ("event", "KcoverQuarantine") in actions.calls
    job, record = current(reconciler, job)
    assert (record.phase, record.step, record.attempt) == (RecoveryPhase.RESTARTING, RestartStep.SUSPENDED, 2)
    assert record.quarantine == ("n0",) and record.method is RestartMethod.NATIVE
    assert record.last is not None and record.last.category == "gpu_hardware" and record.last.nodes == ("n0",)
    assert set(record.replaced) == {"uid-p0", "uid-p1"} and set(record.failing) == {"p0", "p1"}
    assert reconciler.evaluate(job), "old pods still running: wait"
    assert actions.names()[-1] == "suspend", "nothing new while waiting"
    for name in ("p0", "p1"):  # stopped by the suspension: being deleted, they end Failed (SIGTERM)
        reconciler.world.pods[f"uid-{name}"] = dataclasses.replace(reconciler.world.pods[f"uid-{name}"],
                                                                   phase="Failed", deleting=True)
    assert not reconciler.evaluate(job)
    assert actions.names()[-1] == "finish"
    job, record = current(reconciler, job)
    assert (record.phase, record.restarts, record.excluded) == (RecoveryPhase.RUNNING, 1, ("n0",))
    assert not job.suspended
    assert not reconciler.evaluate(job), "the replaced pods are never judged again"
    assert actions.names().count("claim") == 1


def test_a_job_submitted_again_under_the_same_name_gets_its_own_evidence_and_quarantine() -> None:
    """Its attempts count from 1 again: the operator must not take its first restart for the old job's
    (found by bench.k8s_standby: the second job's blamed node was never cordoned and its pod came back there)."""
    reconciler, actions = fake_reconciler()
    job = xid_job(reconciler)
    reconciler.evaluate(job)
    del reconciler.world.jobs[job.key]  # the user deletes the job and its pods, and the node is released
    reconciler.world.pods.clear()
    actions.quarantined.clear()
    actions.calls.clear()
    reconciler.clock.advance(60)
    again = xid_job(reconciler)
    assert reconciler.evaluate(again)
    assert actions.names() == ["claim", "event", "evidence", "quarantine", "event", "suspend"]
    assert current(reconciler, again)[1].attempt == 2


def test_a_replaced_job_is_prepared_once_and_a_deleted_ones_memories_are_forgotten_later() -> None:
    """The operator remembers per job which restart it prepared and which warnings it gave; a long-lived
    operator that sees many jobs come and go must not keep them all (it did: one entry per restart, forever)."""
    reconciler, actions = fake_reconciler()
    world, clock = reconciler.world, reconciler.clock
    job = xid_job(reconciler)
    reconciler.evaluate(job)
    world.warned.add((job.key, "standby"))
    assert job.key in world.prepared
    claimed = current(reconciler, job)[0]
    world.job_deleted(job.key, clock.monotonic())  # replaced by the restart: deleted, then created again
    clock.advance(FORGET_SECONDS - 1)
    reconciler.evaluate_due()
    world.job_seen(claimed)
    calls = len(actions.calls)
    reconciler.evaluate(claimed)
    assert "evidence" not in actions.names()[calls:], "the replaced job's restart is not prepared again"
    clock.advance(FORGET_SECONDS * 2)
    reconciler.evaluate_due()
    assert job.key in world.prepared and (job.key, "standby") in world.warned, "a job still there is remembered"
    for number in range(50):  # jobs that come, fail, restart and go
        other = put(reconciler, job_view("Job", job_body(name=f"t{number}")))
        world.prepared[other.key] = (2, "then")
        world.failing_since[other.key] = clock.monotonic()
        world.mark(other.key, clock.monotonic())
        world.job_deleted(other.key, clock.monotonic())
    world.job_deleted(job.key, clock.monotonic())
    clock.advance(FORGET_SECONDS)
    reconciler.evaluate_due()
    assert (world.prepared, world.failing_since, world.dirty, world.gone, world.warned) == ({}, {}, {}, {}, set())


def test_a_new_leader_replays_evidence_and_quarantine_once() -> None:
    crashed: list[str] = []

    def crash(name: str) -> None:
        if name == "after-claim":
            crashed.append(name)
            raise SystemExit(86)

    old, old_actions = fake_reconciler(failpoint=crash)
    job = xid_job(old)
    with pytest.raises(SystemExit):
        old.evaluate(job)
    assert old_actions.names() == ["claim"] and crashed == ["after-claim"]
    claimed = old.world.jobs[job.key]
    new, actions = fake_reconciler()
    put(new, claimed, *old.world.pods.values())
    assert new.evaluate(claimed)
    assert new.evaluate(new.world.jobs[job.key])
    assert actions.names() == ["event", "evidence", "quarantine", "event", "suspend"], "replayed exactly once"


def test_a_user_bug_that_comes_back_fails_fast_without_a_restart() -> None:
    reconciler, actions = fake_reconciler()
    once = RecoveryRecord(attempt=2, restarts=1, failures=(PastFailure(Category.USER_CODE, "python.keyerror", None),))
    job = put(reconciler, job_view("Job", job_body(recovery=once)),
              pod_view(pod_body("p0", KEYERROR, "n0", "Failed")), pod_view(pod_body("p1", KEYERROR, "n1", "Failed")))
    assert not reconciler.evaluate(job)
    assert actions.names() == ["fail"] and "deterministic user error" in actions.calls[0][1]
    job, record = current(reconciler, job)
    assert record.phase is RecoveryPhase.FAILED and record.restarts == 1 and record.attempt == 2
    assert record.last is not None and record.last.category == "user_code"
    assert not reconciler.evaluate(job), "a failed job is left alone"
    assert actions.names() == ["fail"]


def test_the_second_restart_waits_out_its_backoff() -> None:
    clock = FakeClock()
    reconciler, actions = fake_reconciler(clock)
    earlier = RecoveryRecord(attempt=2, restarts=1, excluded=("n9",))
    job = put(reconciler, job_view("PyTorchJob", job_body("PyTorchJob", earlier)),
              pod_view(pod_body("p0", XID, "n0", kind_label="training.kubeflow.org/job-name")))
    assert reconciler.evaluate(job), "claimed, but the backoff has not passed"
    job, record = current(reconciler, job)
    assert record.not_before is not None and record.not_before > clock.now()
    assert actions.names() == ["claim", "event", "evidence", "quarantine", "event"]
    assert reconciler.evaluate(job)
    assert "delete_pods" not in actions.names()
    clock.advance((record.not_before - clock.now()).total_seconds())
    assert not reconciler.evaluate(job)
    assert actions.names()[-2:] == ["delete_pods", "finish"]
    assert actions.calls[-2] == ("delete_pods", 30), "the PyTorchJob's pods get the policy's grace period"
    _, record = current(reconciler, job)
    assert record.restarts == 2 and record.excluded == ("n9", "n0")


def test_a_failure_long_after_the_last_restart_is_restarted_at_once_and_the_streak_is_recorded() -> None:
    clock = FakeClock()
    reconciler, _ = fake_reconciler(clock)
    earlier = RecoveryRecord(attempt=8, restarts=7, restarted_at=clock.now() - dt.timedelta(hours=2))
    assert earlier.state.streak == 7  # a record from an older operator: every restart counts in the streak
    body = job_body("PyTorchJob", earlier)
    body["metadata"]["annotations"]["kcover.io/max-restarts"] = "100"
    job = put(reconciler, job_view("PyTorchJob", body),
              pod_view(pod_body("p0", XID, "n0", kind_label="training.kubeflow.org/job-name")))
    assert not reconciler.evaluate(job), "no backoff to wait out"
    _, record = current(reconciler, job)
    assert record.restarts == 8 and record.streak == 1 and record.not_before == record.restarted_at
    assert RecoveryRecord.from_annotation(record.to_annotation()).streak == 1


def test_a_batch_job_whose_pods_crashed_is_replaced_and_a_controlled_one_is_not() -> None:
    reconciler, actions = fake_reconciler()
    job = xid_job(reconciler, phase="Failed")
    actions.bodies[("ns", "train")] = {"metadata": {"name": "train", "namespace": "ns"}}
    assert not reconciler.evaluate(job)
    assert actions.names() == ["claim", "event", "evidence", "quarantine", "event", "replace"]
    _, record = current(reconciler, job)
    assert record.method is RestartMethod.RECREATE
    assert actions.calls[-1] == ("replace", RecoveryPhase.RUNNING), "the saved manifest carries the finished record"
    assert reconciler.world.recreating

    reconciler, actions = fake_reconciler()
    job = xid_job(reconciler, phase="Failed")
    actions.bodies[("ns", "train")] = {"metadata": {"name": "train", "namespace": "ns",
                                                    "ownerReferences": [{"controller": True, "kind": "CronJob"}]}}
    assert reconciler.evaluate(job), "resumed natively: suspended first"
    assert not reconciler.evaluate(reconciler.world.jobs[job.key]), "its pods had failed already: resumed at once"
    assert "replace" not in actions.names() and actions.names()[-2:] == ["suspend", "finish"]
    assert [c for c in actions.calls if c == ("event", "KcoverSlowRestart")] == [("event", "KcoverSlowRestart")]


def test_a_batch_job_whose_pods_crash_after_the_claim_is_replaced_not_resumed() -> None:
    """On a real kubelet the fault line reaches the agent before the pod's crash reaches the API server: the
    claim sees Running pods and suspends; when a pod then turns out to have failed by itself, resuming would
    meet the Job controller's failure backoff (seen on real nodes: 7 s, then 17 s), so the Job is replaced."""
    reconciler, actions = fake_reconciler()
    job = xid_job(reconciler)
    actions.bodies[("ns", "train")] = {"metadata": {"name": "train", "namespace": "ns"}}
    assert reconciler.evaluate(job)
    assert actions.names()[-1] == "suspend"
    pods = reconciler.world.pods
    pods["uid-p0"] = dataclasses.replace(pods["uid-p0"], phase="Failed")  # crashed: not deleted by anyone
    pods["uid-p1"] = dataclasses.replace(pods["uid-p1"], phase="Failed", deleting=True)  # stopped by the suspend
    assert not reconciler.evaluate(reconciler.world.jobs[job.key])
    assert actions.names()[-1] == "replace" and "finish" not in actions.names()
    assert actions.calls[-1] == ("replace", RecoveryPhase.RUNNING)
    assert reconciler.world.recreating


def test_a_jobset_whose_pods_crashed_gets_fresh_child_jobs() -> None:
    reconciler, actions = fake_reconciler()
    job = put(reconciler, job_view("JobSet", job_body("JobSet")),
              pod_view(pod_body("p0", XID, "n0", "Failed", kind_label="jobset.sigs.k8s.io/jobset-name")))
    assert reconciler.evaluate(job)
    _, record = current(reconciler, job)
    assert record.method is RestartMethod.RENEW_CHILDREN
    assert not reconciler.evaluate(reconciler.world.jobs[job.key])
    assert actions.names()[-2:] == ["delete_child_jobs", "finish"]


def test_cascade_only_evidence_is_judged_after_the_grace() -> None:
    clock = FakeClock()
    reconciler, actions = fake_reconciler(clock)
    job = put(reconciler, job_view("Job", job_body()), pod_view(pod_body("p1", NCCL, "n1")))
    assert reconciler.evaluate(job) and actions.names() == [], "waits for the agents' report of a cause"
    clock.advance(CAUSE_GRACE_SECONDS)
    assert reconciler.evaluate(job)
    _, record = current(reconciler, job)
    assert record.quarantine == (), "nobody is blamed for a cascade alone"


def test_a_conflicting_claim_is_looked_at_again_and_the_settle_is_kept() -> None:
    clock = FakeClock()
    reconciler, actions = fake_reconciler(clock)
    job = xid_job(reconciler)
    actions.conflict = True
    reconciler.world.mark(job.key, clock.monotonic())
    reconciler.evaluate_due()
    assert actions.names() == [] and job.key in reconciler.world.dirty, "not yet settled"
    clock.advance(SETTLE_SECONDS)
    reconciler.evaluate_due()
    assert job.key in reconciler.world.dirty, "another replica acted first: look again"
    actions.conflict = False
    clock.advance(SETTLE_SECONDS)
    reconciler.evaluate_due()
    assert "claim" in actions.names()


def test_jobs_not_opted_in_or_finished_are_never_touched() -> None:
    reconciler, actions = fake_reconciler()
    body = job_body()
    body["metadata"]["labels"] = {}
    job = put(reconciler, job_view("Job", body), pod_view(pod_body("p0", XID, "n0", "Failed")))
    reconciler.world.mark(job.key, 0.0)
    reconciler.evaluate_due()
    finished = dataclasses.replace(job_view("Job", job_body()), finished=True)
    assert not reconciler.evaluate(finished)
    assert actions.names() == []


def test_replaced_jobs_announce_their_restart() -> None:
    reconciler, actions = fake_reconciler()
    done = RecoveryRecord(attempt=2, restarts=1).completed()
    actions.pending = [job_body(recovery=done)]
    reconciler.finish_replacements()
    assert actions.calls == [("event", "KcoverRestart")]
    assert not reconciler.world.recreating


@pytest.mark.parametrize("annotation", [
    None, "", "not json", "[]", "null", "1e999", '{"attempt": "two", "phase": "exploded", "failures": "x"}',
    '{"attempt": -5, "restarts": true, "excluded": [1, null, "n1"], "not_before": "yesterday", "last": []}',
    "[" * 100_000, '{"attempt": ' + "9" * 5000 + "}",
])
def test_an_unreadable_record_is_the_empty_record_never_a_crash(annotation: str | None) -> None:
    record = RecoveryRecord.from_annotation(annotation)
    assert record.phase is RecoveryPhase.RUNNING and record.attempt >= 1 and record.restarts >= 0
    assert all(isinstance(node, str) for node in record.excluded)
    assert RecoveryRecord.from_annotation(record.to_annotation()) == record


def test_records_written_by_an_older_operator_are_read_the_same() -> None:
    old = {"restarts": 1, "failures": [{"category": "gpu_hardware", "rule": "xid.79.fallen-off-bus",
                                        "hung_at_step": None}], "excluded": ["n0"], "attempt": 2,
           "phase": "restarting", "restarted_at": "2026-12-01T11:00:00Z", "not_before": "2026-12-01T11:00:04Z",
           "replaced": ["u1"], "failing": ["p0"], "exclude": ["n0"], "method": "recreate", "step": "suspended",
           "last": {"category": "gpu_hardware", "rule": "xid.79.fallen-off-bus", "nodes": ["n0"], "decision": "x"},
           "future_key": {"kept": True}}
    record = RecoveryRecord.from_annotation(json.dumps(old))
    assert record.quarantine == ("n0",) and record.method is RestartMethod.RECREATE
    assert record.step is RestartStep.SUSPENDED
    assert record.not_before == dt.datetime(2026, 12, 1, 11, 0, 4, tzinfo=dt.UTC)
    assert not record.due(dt.datetime(2026, 12, 1, 11, 0, 3, 999000, tzinfo=dt.UTC)), "times compare as times"
    assert record.due(dt.datetime(2026, 12, 1, 11, 0, 4, tzinfo=dt.UTC))
    written = json.loads(record.to_annotation())
    assert written["future_key"] == {"kept": True}, "keys a newer operator wrote survive"
    assert written["last"]["nodes"] == ["n0"] and written["restarts"] == 1
