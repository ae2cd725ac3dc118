"""Warm standby in the operator's saga, against the fakes of ``test_reconcile``: ranks, takeovers, the end.

A batch Job with ``kcover.io/standby: "1"`` and parallelism 3 runs two ranks and one standby pod, each under
``kcover pod --assigned-rank`` (the pod's side: ``tests/launcher/test_pod_standby.py``).
"""

from __future__ import annotations

import dataclasses
import json

from prometheus_client import REGISTRY
from tests.k8s.test_in_place import arrive, kcover_pod, settle
from tests.k8s.test_reconcile import XID, FakeClock, current, fake_reconciler, job_body, put

from kcover.k8s.names import RANK, STANDBY
from kcover.k8s.operator.record import RecoveryPhase, RecoveryRecord, RestartMethod, RestartStep
from kcover.k8s.operator.standby import assignments
from kcover.k8s.operator.views import JobView, PodView, job_view, pod_view
from kcover.podline import PodState


def standby_job(standby: str = "1", parallelism: int | None = 3) -> JobView:
    body = job_body()
    body["metadata"]["annotations"][STANDBY] = standby
    if parallelism is not None:
        body["spec"]["parallelism"] = parallelism
    return job_view("Job", body)


def pod(name: str, node: str, index: int, assigned: str | None, state: PodState = PodState.RUNNING,
        phase: str = "Running", text: str = "", generation: int = 0) -> PodView:
    """A pod of the Job with completion index ``index`` and the operator's ``kcover.io/rank`` (None: not yet)."""
    view = kcover_pod(name, node, generation=generation, state=state, text=text, phase=phase)
    return dataclasses.replace(view, rank=index, assigned=assigned)


def test_new_pods_get_their_indexs_rank_and_the_extra_pods_stand_by() -> None:
    reconciler, actions = fake_reconciler()
    job = put(reconciler, standby_job(), pod("p2", "n2", 2, None, PodState.STANDBY), pod("p0", "n0", 0, None),
              pod("p1", "n1", 1, None))
    reconciler.evaluate(job)
    assert ("assign", {"p0": "0", "p1": "1", "p2": "standby"}) in actions.calls
    actions.calls.clear()
    reconciler.evaluate(job)
    assert "assign" not in actions.names()  # written once


def standby_restarts() -> float:
    return REGISTRY.get_sample_value("kcover_in_place_restarts_total", {"method": "standby", "outcome": "done"}) or 0.0


def test_a_blamed_nodes_rank_goes_to_a_standby_and_the_others_restart_in_place() -> None:
    before = standby_restarts()
    clock = FakeClock()
    reconciler, actions = fake_reconciler(clock)
    job = put(reconciler, standby_job(), pod("p0", "n0", 0, "0"), pod("p1", "n1", 1, "1", text=XID),
              pod("p2", "n2", 2, "standby", PodState.STANDBY))
    settle(reconciler, clock, job)
    _, record = current(reconciler, job)
    assert record.method is RestartMethod.STANDBY and record.quarantine == ("n1",)
    assert record.replaced == ("uid-p1",) and record.takeover == (("uid-p2", 1),)
    assert record.in_place_pods == ("uid-p0", "uid-p2") and record.step is RestartStep.ORDERED
    assert "rank(s) 1 taken over by standby pod(s) p2, 1 pod(s) restarted in place" in record.why
    names = actions.names()
    assert names.index("quarantine") < names.index("delete_pods") < names.index("order")
    assert reconciler.world.pods["uid-p2"].assigned == "1" and reconciler.world.pods["uid-p2"].ordered == 1
    # the Job controller's replacement for index 1 comes while the restart is under way: it stands by
    del reconciler.world.pods["uid-p1"]
    reconciler.world.pods["uid-p1b"] = pod("p1b", "n3", 1, None, PodState.STANDBY)
    settle(reconciler, clock, job)
    assert ("assign", {"p1b": "standby"}) in actions.calls
    arrive(reconciler, 1, "p0", "p2")
    settle(reconciler, clock, job)
    _, record = current(reconciler, job)
    assert record.phase is RecoveryPhase.RUNNING and record.restarts == 1
    assert actions.names().count("order") == 1 and actions.names().count("delete_pods") == 1
    assert ("event", "KcoverRestart") in actions.calls[-2:]
    assert standby_restarts() == before + 1  # counted as a standby restart, not an in-place one


def test_without_a_ready_standby_the_pods_are_restarted_and_the_record_says_why() -> None:
    clock = FakeClock()
    reconciler, actions = fake_reconciler(clock)
    starting = dataclasses.replace(pod("p2", "n2", 2, "standby"), status=None, phase="Pending")
    job = put(reconciler, standby_job(), pod("p0", "n0", 0, "0"), pod("p1", "n1", 1, "1", text=XID), starting)
    settle(reconciler, clock, job)
    _, record = current(reconciler, job)
    assert record.method is RestartMethod.NATIVE and record.takeover == ()
    assert record.why == "pods restarted: n1 is blamed; 1 rank(s) to hand over, 0 standby pod(s) ready"
    assert "suspend" in actions.names() and "order" not in actions.names()


def test_a_standby_on_the_blamed_node_is_not_used_and_goes_with_it() -> None:
    clock = FakeClock()
    reconciler, _ = fake_reconciler(clock)
    job = put(reconciler, standby_job("2", 4), pod("p0", "n0", 0, "0"), pod("p1", "n1", 1, "1", text=XID),
              pod("p2", "n1", 2, "standby", PodState.STANDBY), pod("p3", "n3", 3, "standby", PodState.STANDBY))
    settle(reconciler, clock, job)
    _, record = current(reconciler, job)
    assert record.method is RestartMethod.STANDBY
    assert record.takeover == (("uid-p3", 1),) and set(record.replaced) == {"uid-p1", "uid-p2"}


def test_a_rank_pod_that_cannot_restart_in_place_restarts_the_pods() -> None:
    clock = FakeClock()
    reconciler, _ = fake_reconciler(clock)
    gone = dataclasses.replace(pod("p0", "n0", 0, "0"), status=None)  # no kcover pod report
    job = put(reconciler, standby_job(), gone, pod("p1", "n1", 1, "1", text=XID),
              pod("p2", "n2", 2, "standby", PodState.STANDBY))
    settle(reconciler, clock, job)
    _, record = current(reconciler, job)
    assert record.method is RestartMethod.NATIVE and "p0 cannot restart in place" in record.why


def test_standby_pods_take_no_part_in_an_in_place_restart() -> None:
    """A crashed rank blames no node: the two ranks' pods restart in place, the standby is not ordered."""
    clock = FakeClock()
    reconciler, _ = fake_reconciler(clock)
    crashed = pod("p0", "n0", 0, "0", PodState.FAILED, text="Traceback (most recent call last):\nKeyError: 'x'")
    job = put(reconciler, standby_job(), crashed, pod("p1", "n1", 1, "1"),
              pod("p2", "n2", 2, "standby", PodState.STANDBY))
    settle(reconciler, clock, job)
    _, record = current(reconciler, job)
    assert record.method is RestartMethod.IN_PLACE and record.in_place_pods == ("uid-p0", "uid-p1")
    assert reconciler.world.pods["uid-p2"].ordered is None


def test_once_every_rank_succeeded_the_standbys_are_released() -> None:
    reconciler, actions = fake_reconciler()
    job = put(reconciler, standby_job(), pod("p0", "n0", 0, "0", PodState.DONE, phase="Succeeded"),
              pod("p1", "n1", 1, "1", PodState.DONE), pod("p2", "n2", 2, "standby", PodState.STANDBY))
    reconciler.evaluate(job)
    assert "assign" not in actions.names()  # rank 1 still runs
    reconciler.world.pods["uid-p1"] = dataclasses.replace(reconciler.world.pods["uid-p1"], phase="Succeeded")
    reconciler.evaluate(job)
    assert ("assign", {"p2": "done"}) in actions.calls


def test_standby_that_cannot_be_honoured_is_named_once() -> None:
    reconciler, actions = fake_reconciler()
    for job in (standby_job(parallelism=None), standby_job("3", 3), standby_job("many")):
        put(reconciler, job)
        reconciler.evaluate(job)
    warnings = [c for c in actions.calls if c[0] == "event" and c[1] == "KcoverBadAnnotation"]
    assert len(warnings) == 2  # one per message: no parallelism / too few pods, and the bad number
    assert "assign" not in actions.names()


def test_assignments_never_give_a_rank_twice_and_keep_handed_ones() -> None:
    pods = [pod("a", "n0", 0, None), pod("b", "n1", 1, None), pod("c", "n2", 1, None), pod("d", "n3", 5, None),
            pod("e", "n4", 0, None, phase="Failed"), pod("f", "n5", None, None)]  # type: ignore[arg-type]
    assert assignments(pods, 2) == {"uid-a": "0", "uid-b": "1", "uid-c": "standby", "uid-d": "standby",
                                    "uid-f": "standby"}
    assert assignments(pods, 2, handed={1}) == {"uid-a": "0", "uid-b": "standby", "uid-c": "standby",
                                                "uid-d": "standby", "uid-f": "standby"}
    going = [dataclasses.replace(pod("g", "n0", 0, "0"), deleting=True), pod("h", "n1", 0, None)]
    assert assignments(going, 1) == {"uid-h": "0"}  # a pod on its way out holds no rank


def test_a_standby_restarts_record_reads_back_and_junk_is_ignored() -> None:
    record = RecoveryRecord(method=RestartMethod.STANDBY, takeover=(("uid-p2", 1),), replaced=("uid-p1",))
    assert RecoveryRecord.from_annotation(record.to_annotation()) == record
    raw = json.loads(record.to_annotation()) | {"takeover": [["u", -1], ["v", True], [1, 2], ["w"], "x", ["ok", 3]]}
    assert RecoveryRecord.from_annotation(json.dumps(raw)).takeover == (("ok", 3),)


def test_the_rank_annotation_reads_into_the_pods_view() -> None:
    assert kcover_pod("p0", "n0").assigned is None
    view = pod_view({"metadata": {"uid": "u", "name": "p", "namespace": "ns", "annotations": {RANK: "7" * 100},
                                  "labels": {"batch.kubernetes.io/job-name": "train"}},
                     "status": {"phase": "Running"}})
    assert view.assigned == "7" * 16
