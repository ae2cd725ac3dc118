"""The operator's decision step, without a cluster: views in, assessment out."""

from __future__ import annotations

import json

from kcover import explain
from kcover.classify.collector import FaultCollector
from kcover.classify.matcher import default_matcher
from kcover.decide.policy import DecisionKind, RecoveryPolicy
from kcover.faults import NO_PROGRESS_RULE, Evidence, Fault
from kcover.k8s import wire
from kcover.k8s.operator.assess import assess, hung_step
from kcover.k8s.operator.views import job_view, pod_view

HANG = "No training progress for 5 s (last step 30; timeout 3 s)"


def hang_fault(name: str, step: int | None) -> Fault:
    """The fault the node agent records for a hang: the rule by id, the step as a field."""
    rule = next(r for r in default_matcher().rules if r.id == NO_PROGRESS_RULE)
    fault = FaultCollector().add(rule, Evidence(source=f"{name}/progress", line=HANG, step=step))
    assert fault is not None
    return fault


def pod(name: str, faults_text: str, node: str, phase: str = "Running", faults: list[Fault] | None = None,
        rank: int | None = None) -> dict[str, object]:
    faults = faults if faults is not None else explain(faults_text, source=name).faults
    annotations = {"kcover.io/faults": wire.encode(faults)}
    if rank is not None:
        annotations["batch.kubernetes.io/job-completion-index"] = str(rank)
    return {"metadata": {"uid": f"uid-{name}", "namespace": "ns", "name": name, "creationTimestamp": "t",
                         "labels": {"batch.kubernetes.io/job-name": "train"}, "annotations": annotations},
            "spec": {"nodeName": node}, "status": {"phase": phase}}


def job(recovery: dict[str, object] | None = None) -> dict[str, object]:
    annotations = {"kcover.io/recovery": json.dumps(recovery)} if recovery else {}
    return {"metadata": {"name": "train", "namespace": "ns", "uid": "u", "resourceVersion": "1",
                         "labels": {"kcover.io/cascading-recovery": "true"}, "annotations": annotations}}


def test_hang_step_travels_as_a_field_through_the_pod_annotation() -> None:
    rules = default_matcher().rules
    view = pod_view(pod("p0", "", "n0", faults=[hang_fault("p0", 30)]))
    verdict = assess(job_view("Job", job()), [view], rules, RecoveryPolicy(min_nodes=1)).verdict
    assert verdict is not None and hung_step(verdict) == 30
    assert hung_step(explain(HANG)) is None, "the step is never parsed back out of the text"
    assert hung_step(explain("KeyError: 'x'")) is None


def test_a_hang_at_the_same_step_twice_fails_the_job() -> None:
    rules = default_matcher().rules
    pods = [pod_view(pod(f"p{i}", "", f"n{i}", faults=[hang_fault(f"p{i}", 30)])) for i in range(2)]
    first = assess(job_view("Job", job()), pods, rules, RecoveryPolicy(min_nodes=1))
    assert first.decision is not None and first.decision.kind is DecisionKind.RESTART
    again = assess(job_view("Job", job({"restarts": 1, "failures": [
        {"category": "collective_timeout_hang", "rule": "job.no-progress", "hung_at_step": 30}]})),
        pods, rules, RecoveryPolicy(min_nodes=1))
    assert again.decision is not None and again.decision.kind is DecisionKind.FAIL
    assert "hang recurred at step 30" in again.decision.reason


def test_replaced_and_terminating_pods_are_not_judged_again() -> None:
    rules = default_matcher().rules
    xid = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python, GPU has fallen off the bus."
    pods = [pod_view(pod("p0", xid, "n0"))]
    after = assess(job_view("Job", job({"restarts": 1, "replaced": ["uid-p0"]})), pods, rules, RecoveryPolicy())
    assert not after.failed


def test_specs_that_defeat_a_restart_are_named() -> None:
    from kcover.k8s.operator.views import spec_problems

    never = {"pytorchReplicaSpecs": {"Master": {"restartPolicy": "OnFailure"}, "Worker": {"restartPolicy": "Never"}}}
    assert [p.split(":")[0] for p in spec_problems("PyTorchJob", never)] == ["replica Worker has restartPolicy Never"]
    assert spec_problems("PyTorchJob", {"pytorchReplicaSpecs": {"Worker": {}}}) == ()
    bare = spec_problems("Job", {"backoffLimit": 3})
    assert len(bare) == 1 and "backoffLimit (3)" in bare[0]
    ignoring = {"podFailurePolicy": {"rules": [{"action": "Ignore", "onExitCodes": {"operator": "NotIn",
                                                                                    "values": [0]}}]}}
    assert spec_problems("Job", ignoring) == ()
    assert spec_problems("JobSet", {}) == ()


def test_cascade_only_evidence_waits_a_moment_for_the_cause() -> None:
    from tests.k8s.test_reconcile import FakeClock, fake_reconciler

    from kcover.k8s.operator.reconcile import CAUSE_GRACE_SECONDS

    clock = FakeClock()
    reconciler, _ = fake_reconciler(clock)
    world, _awaiting_cause = reconciler.world, reconciler._awaiting_cause
    rules = default_matcher().rules
    nccl = ("[rank1]: torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, "
            "remote process exited or there was a network error, NCCL version 2.20.5")
    xid = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python, GPU has fallen off the bus."
    view = job_view("Job", job())
    cascade = assess(view, [pod_view(pod("p1", nccl, "n1", "Failed"))], rules, RecoveryPolicy())
    assert cascade.failed
    assert _awaiting_cause(view, cascade), "the first look at cascade-only evidence waits"
    clock.advance(CAUSE_GRACE_SECONDS + 0.1)
    assert not _awaiting_cause(view, cascade), "but not past the grace"
    world.failing_since.pop(view.key, None)
    rooted = assess(view, [pod_view(pod("p0", xid, "n0", "Failed")), pod_view(pod("p1", nccl, "n1", "Failed"))],
                    rules, RecoveryPolicy())
    assert not _awaiting_cause(view, rooted), "a root cause is acted on at once"



def test_no_pod_is_named_a_laggard_from_its_index() -> None:
    """A pod's completion index is no rank: pod k runs ranks 2k and 2k+1, and every rank timed out here."""
    def timeout(rank: int) -> str:
        return (f"[rank{rank}]:[E ProcessGroupNCCL.cpp:563] [Rank {rank}] Watchdog caught collective operation "
                f"timeout: WorkNCCL(SeqNum=15037, OpType=ALLREDUCE, NumelIn=8, NumelOut=8, Timeout(ms)=600000) "
                "ran for 600055 milliseconds before timing out.")
    views = [pod_view(pod(f"p{k}", timeout(2 * k) + "\n" + timeout(2 * k + 1), f"n{k}", "Failed", rank=k))
             for k in range(4)]
    found = assess(job_view("Job", job()), views, default_matcher().rules, RecoveryPolicy())
    assert found.verdict is not None and found.verdict.ranks == ()
    assert "left no sign" in found.verdict.reason
