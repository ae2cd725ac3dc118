"""In-place restarts in the operator's saga, against the fakes of ``test_reconcile``: when, and what then.

A job whose pods run ``kcover pod`` and whose failure blames no node gets a new
generation instead of new pods; a blamed node, a pod without kcover, a pod lost
or failing during the restart, a restart that takes too long, or the same
failure again each fall back to restarting the pods, with the reason recorded.
The real pods, agent and kubelet play the same story in
``tests/cluster/test_real_in_place.py``.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from tests.k8s.test_reconcile import XID, FakeClock, current, fake_reconciler, job_body, pod_body, put

from kcover import explain
from kcover.classify.exit_codes import describe_exit, rule_for_exit
from kcover.classify.matcher import default_matcher
from kcover.faults import Evidence, Fault
from kcover.k8s import wire
from kcover.k8s.names import IN_PLACE, POD_FAULTS, POD_STATE
from kcover.k8s.operator import inplace, standby
from kcover.k8s.operator.assess import assess
from kcover.k8s.operator.policy import JobPolicy
from kcover.k8s.operator.record import RecoveryPhase, RecoveryRecord, RestartMethod, RestartStep
from kcover.k8s.operator.views import JobView, PodView, job_view, pod_view
from kcover.podline import PodState

RULES = default_matcher().rules


def crash(name: str, node: str, generation: int, code: int = -9, step: int = 40) -> Fault:
    """The fault the agent records for a rank that ``kcover pod`` reported failed."""
    rule = rule_for_exit(RULES, code)
    assert rule is not None
    evidence = Evidence(source=f"{name}/main", line=f"rank 1: {describe_exit(code)} in generation {generation}",
                        rank=1, node=node, step=step)
    return Fault(rule.id, rule.spec.category, rule.spec.severity, rule.spec.retriable, rule.spec.node_at_fault,
                 rule.spec.role, rule.spec.priority, rule.spec.title, "", evidence)


def kcover_pod(name: str, node: str, generation: int = 0, state: PodState = PodState.RUNNING, step: int | None = 40,
               faults: list[tuple[Fault, int]] | None = None, text: str = "", phase: str = "Running") -> PodView:
    """A pod running ``kcover pod``: its state and faults as the agent records them."""
    body = pod_body(name, text, node, phase)
    records = json.loads(body["metadata"]["annotations"][POD_FAULTS])
    records += [{**wire.fault_record(f), "generation": g} for f, g in (faults or [])]
    body["metadata"]["annotations"] |= {POD_FAULTS: json.dumps(records),
                                        POD_STATE: wire.PodStatus(generation, state, True, step).encode()}
    return pod_view(body)


def crashed_job(reconciler: Any, annotations: dict[str, str] | None = None) -> JobView:
    body = job_body()
    body["metadata"]["annotations"] |= annotations or {}
    return put(reconciler, job_view("Job", body),
               kcover_pod("p0", "n0", state=PodState.FAILED, faults=[(crash("p0", "n0", 0), 0)]),
               kcover_pod("p1", "n1"))


def settle(reconciler: Any, clock: FakeClock, job: JobView) -> None:
    """Let the settle and the wait for a cause pass, then evaluate once."""
    clock.advance(5.0)
    reconciler.world.mark(job.key, clock.monotonic() - 5.0)
    reconciler.evaluate_due()


def arrive(reconciler: Any, generation: int, *names: str) -> None:
    """``kcover pod`` in each named pod reports running the generation (as the agent records it)."""
    for uid, pod in list(reconciler.world.pods.items()):
        if pod.name in names:
            reconciler.world.pods[uid] = dataclasses.replace(
                pod, status=wire.PodStatus(generation, PodState.RUNNING, True, None), faults=())


def test_a_crashed_rank_restarts_every_pods_workers_in_place_and_no_pod_is_touched() -> None:
    clock = FakeClock()
    reconciler, actions = fake_reconciler(clock)
    job = crashed_job(reconciler)
    settle(reconciler, clock, job)
    _, record = current(reconciler, job)
    assert record.method is RestartMethod.IN_PLACE and record.generation == 1
    assert record.in_place_pods == ("uid-p0", "uid-p1") and record.replaced == () and record.in_place_step == 40
    assert record.step is RestartStep.ORDERED and record.phase is RecoveryPhase.RESTARTING
    assert "in place: no node blamed, 2 pods" in record.why
    assert ("order", 1) in actions.calls
    assert not {"delete_pods", "suspend", "replace", "quarantine"} & set(actions.names())
    assert {p.ordered for p in reconciler.world.pods.values()} == {1}

    arrive(reconciler, 1, "p0")
    settle(reconciler, clock, job)
    assert current(reconciler, job)[1].phase is RecoveryPhase.RESTARTING  # p1 has not come yet
    arrive(reconciler, 1, "p1")
    settle(reconciler, clock, job)
    _, record = current(reconciler, job)
    assert record.phase is RecoveryPhase.RUNNING and record.restarts == 1
    assert actions.names().count("order") == 1 and actions.names()[-2:] == ["finish", "event"]


def test_faults_of_an_earlier_generation_are_not_judged_again() -> None:
    old = crash("p0", "n0", 0)
    pod = kcover_pod("p0", "n0", generation=1, faults=[(old, 0)])
    assert pod.faults == ()
    again = kcover_pod("p0", "n0", generation=1, state=PodState.FAILED, faults=[(old, 0), (crash("p0", "n0", 1), 1)])
    assert [f.evidence.line for f in again.faults] == ["rank 1: worker exited with exit code 137 (killed by signal 9) "
                                                      "in generation 1"]
    record = RecoveryRecord(generation=1)
    assert not assess(job_view("Job", job_body()), [pod, kcover_pod("p1", "n1", generation=1)], RULES,
                      JobPolicy().recovery, record).failed


def test_a_blamed_node_restarts_the_pods_and_says_why() -> None:
    clock = FakeClock()
    reconciler, actions = fake_reconciler(clock)
    job = put(reconciler, job_view("Job", job_body()), kcover_pod("p0", "n0", text=XID), kcover_pod("p1", "n1"))
    settle(reconciler, clock, job)
    _, record = current(reconciler, job)
    assert record.method is RestartMethod.NATIVE and record.quarantine == ("n0",)
    assert record.why == "pods restarted: n0 is blamed, its pod must move"
    assert "order" not in actions.names() and "suspend" in actions.names()


def test_a_pod_without_kcover_pod_restarts_the_pods_and_names_it() -> None:
    clock = FakeClock()
    reconciler, _ = fake_reconciler(clock)
    plain = pod_view(pod_body("p1", "", "n1"))
    job = put(reconciler, job_view("Job", job_body()),
              kcover_pod("p0", "n0", state=PodState.FAILED, faults=[(crash("p0", "n0", 0), 0)]), plain)
    settle(reconciler, clock, job)
    _, record = current(reconciler, job)
    assert record.method is RestartMethod.NATIVE
    assert record.why.startswith("pods restarted: p1 cannot restart in place")


def test_the_job_can_turn_in_place_restarts_off() -> None:
    clock = FakeClock()
    reconciler, _ = fake_reconciler(clock)
    job = crashed_job(reconciler, {IN_PLACE: "false"})
    settle(reconciler, clock, job)
    _, record = current(reconciler, job)
    assert record.method is RestartMethod.NATIVE and "off for this job" in record.why


def test_a_restart_that_takes_too_long_restarts_the_pods_in_the_same_attempt() -> None:
    clock = FakeClock()
    reconciler, actions = fake_reconciler(clock)
    job = crashed_job(reconciler)
    settle(reconciler, clock, job)
    attempt = current(reconciler, job)[1].attempt
    arrive(reconciler, 1, "p0")  # p1 never comes (its kcover pod is stuck)
    clock.advance(JobPolicy().in_place_timeout + 1)
    settle(reconciler, clock, job)
    _, record = current(reconciler, job)
    assert record.method is RestartMethod.NATIVE and record.attempt == attempt
    assert record.why.startswith("pods restarted: generation 1 not running in every pod after")
    assert set(record.replaced) == {"uid-p0", "uid-p1"}
    assert "KcoverInPlaceEscalated" in [detail for name, detail in actions.calls if name == "event"]
    assert actions.names().count("evidence") == 1 and "suspend" in actions.names()


def test_a_pod_lost_during_the_restart_restarts_the_pods_at_once() -> None:
    clock = FakeClock()
    reconciler, actions = fake_reconciler(clock)
    job = crashed_job(reconciler)
    settle(reconciler, clock, job)
    reconciler.world.pods.pop("uid-p1")
    settle(reconciler, clock, job)
    _, record = current(reconciler, job)
    assert record.method is RestartMethod.NATIVE and "went away" in record.why
    assert "suspend" in actions.names()


def test_a_generation_that_fails_again_during_the_restart_restarts_the_pods() -> None:
    clock = FakeClock()
    reconciler, _ = fake_reconciler(clock)
    job = crashed_job(reconciler)
    settle(reconciler, clock, job)
    pod = reconciler.world.pods["uid-p1"]
    reconciler.world.pods["uid-p1"] = dataclasses.replace(pod, status=wire.PodStatus(1, PodState.FAILED, True, 3))
    settle(reconciler, clock, job)
    _, record = current(reconciler, job)
    assert record.method is RestartMethod.NATIVE and record.why == "pods restarted: pod p1 failed again in generation 1"


def test_the_same_failure_again_at_the_same_step_restarts_the_pods() -> None:
    clock = FakeClock()
    reconciler, _ = fake_reconciler(clock)
    job = crashed_job(reconciler)
    settle(reconciler, clock, job)
    arrive(reconciler, 1, "p0", "p1")
    settle(reconciler, clock, job)
    assert current(reconciler, job)[1].phase is RecoveryPhase.RUNNING
    for name, node in (("p0", "n0"), ("p1", "n1")):  # generation 1 crashes again, no further than step 40
        failed = kcover_pod(name, node, generation=1, state=PodState.FAILED, step=40,
                            faults=[(crash(name, node, 1), 1)])
        reconciler.world.pods[f"uid-{name}"] = failed
    clock.advance(60)
    settle(reconciler, clock, job)
    _, record = current(reconciler, job)
    assert record.method is RestartMethod.NATIVE and record.in_place_step is None
    assert "failed again at step 40, no further than the in-place restart after step 40" in record.why


def die_after_order(name: str) -> None:
    if name == "after-order":
        raise SystemExit(name)


def test_a_new_leader_orders_the_same_generation_again_and_finishes() -> None:
    clock = FakeClock()
    reconciler, _ = fake_reconciler(clock, failpoint=die_after_order)
    job = crashed_job(reconciler)
    with pytest.raises(SystemExit):
        settle(reconciler, clock, job)
    _, record = current(reconciler, job)
    assert record.step is RestartStep.CLAIMED and record.generation == 1  # died before recording the order
    successor, again = fake_reconciler(clock)
    successor.world = reconciler.world
    again.world = reconciler.world
    settle(successor, clock, job)
    assert ("order", 1) in again.calls and current(successor, job)[1].step is RestartStep.ORDERED
    arrive(successor, 1, "p0", "p1")
    settle(successor, clock, job)
    assert current(successor, job)[1].phase is RecoveryPhase.RUNNING


def test_the_record_of_an_in_place_restart_reads_back_the_same() -> None:
    record = RecoveryRecord(generation=3, in_place_pods=("a", "b"), in_place_step=12, why="in place: x",
                            method=RestartMethod.IN_PLACE, step=RestartStep.ORDERED,
                            ordered_at=FakeClock().now())
    assert RecoveryRecord.from_annotation(record.to_annotation()) == record
    garbled = json.loads(record.to_annotation()) | {"generation": "x", "in_place_step": -1, "in_place_pods": 7}
    read = RecoveryRecord.from_annotation(json.dumps(garbled))
    assert (read.generation, read.in_place_step, read.in_place_pods) == (0, None, ())


def test_a_worker_failure_the_catalog_cannot_name_still_restarts_in_place() -> None:
    clock = FakeClock()
    reconciler, _ = fake_reconciler(clock)
    job = put(reconciler, job_view("Job", job_body()), kcover_pod("p0", "n0", state=PodState.FAILED),
              kcover_pod("p1", "n1"))
    settle(reconciler, clock, job)  # no cause named: the agents get their moment to report one
    assert current(reconciler, job)[1].phase is RecoveryPhase.RUNNING
    settle(reconciler, clock, job)
    _, record = current(reconciler, job)
    assert record.method is RestartMethod.IN_PLACE and record.phase is RecoveryPhase.RESTARTING


def test_a_pod_that_finished_in_the_new_generation_does_not_escalate() -> None:
    clock = FakeClock()
    reconciler, _ = fake_reconciler(clock)
    job = crashed_job(reconciler)
    settle(reconciler, clock, job)
    arrive(reconciler, 1, "p0")
    done = reconciler.world.pods["uid-p1"]
    reconciler.world.pods["uid-p1"] = dataclasses.replace(done, phase="Succeeded",
                                                          status=wire.PodStatus(1, PodState.DONE, True, 60))
    settle(reconciler, clock, job)
    _, record = current(reconciler, job)
    assert record.method is RestartMethod.IN_PLACE and record.phase is RecoveryPhase.RUNNING


def test_huge_numbers_in_a_pods_annotations_are_ignored_never_a_crash() -> None:
    """Anyone who may patch a pod can write its annotations: a number beyond Python's 4,300-digit int() limit in
    the generation, the faults or the workers' state reads as absent."""
    body = pod_body("p0", "", "n0")
    huge = "9" * 5000
    body["metadata"]["annotations"] |= {"kcover.io/generation": huge, POD_FAULTS: f"[{huge}]",
                                        POD_STATE: f'{{"generation": {huge}, "state": "running"}}'}
    view = pod_view(body)
    assert (view.ordered, view.faults, view.status) == (None, (), None)
    body["metadata"]["annotations"]["kcover.io/generation"] = "1000000001"
    assert pod_view(body).ordered is None


def test_a_node_named_in_a_log_but_running_none_of_the_jobs_pods_does_not_stop_an_in_place_restart() -> None:
    """Slurm's "Node failure on gpu-77" in a worker's log blames gpu-77; the job's pods run on n0 and n1."""
    verdict = explain("srun: error: Node failure on gpu-77\n", source="p0/main")
    assert verdict.nodes == ("gpu-77",) and verdict.node_at_fault
    pods = [kcover_pod("p0", "n0", state=PodState.FAILED), kcover_pod("p1", "n1")]
    choice = inplace.choose(pods, verdict, (), RecoveryRecord(), JobPolicy())
    assert choice.order is not None, choice.why
    assert standby.choose(pods, verdict, (), RecoveryRecord(), JobPolicy()) is None
    # the same line naming a node of the job moves that node's pod
    named = explain("srun: error: Node failure on n1\n", source="p0/main")
    moved = inplace.choose(pods, named, (), RecoveryRecord(), JobPolicy())
    assert moved.order is None and moved.why == "pods restarted: n1 is blamed, its pod must move"
