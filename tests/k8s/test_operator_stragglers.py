"""Stragglers found by the operator across pods, against the fakes of ``test_reconcile``.

Each pod's step times arrive as the agent writes them (``kcover.io/step-times``:
the newest 32 steps of each of its ranks, rewritten every few steps), and the
reconciler looks at the job after each write.  The real agent, operator and
``kcover status`` play the same story in ``test_stragglers_e2e``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import json
import random
import re

from prometheus_client import REGISTRY
from tests.k8s.test_in_place import kcover_pod
from tests.k8s.test_reconcile import FakeActions, current, fake_reconciler, job_body, put

from kcover.k8s import wire
from kcover.k8s.names import STRAGGLER_ACTION, STRAGGLERS, TOTAL_STEPS
from kcover.k8s.operator.metrics import STRAGGLER
from kcover.k8s.operator.reconcile import Conflict, Reconciler
from kcover.k8s.operator.record import RecoveryPhase, RecoveryRecord, RestartMethod
from kcover.k8s.operator.stragglers import decode
from kcover.k8s.operator.views import JobView, job_view
from kcover.k8s.progress import PodProgress

RANKS = 4


def slowdown(namespace: str, job: str, node: str, rank: int) -> float | None:
    return REGISTRY.get_sample_value("kcover_straggler_slowdown",
                                     {"namespace": namespace, "job": job, "node": node, "rank": str(rank)})


def start(name: str = "train") -> tuple[Reconciler, list[tuple[str, object]], JobView]:
    reconciler, actions = fake_reconciler()
    job = put(reconciler, job_view("Job", job_body(name=name)),
              *(dataclasses.replace(kcover_pod(f"p{r}", f"n{r}"), job=("Job", name)) for r in range(RANKS)))
    return reconciler, actions.calls, job


def play(reconciler: Reconciler, job: JobView, steps: range, seconds: dict[int, list[float]], every: int = 4) -> None:
    """Every ``every`` steps each pod's agent rewrites the pod's newest 32 step times; the job is evaluated."""
    for end in range(steps.start + every, steps.stop + 1, every):
        for rank in range(RANKS):
            uid = f"uid-p{rank}"
            pod = reconciler.world.pods[uid]
            newest = {s: seconds[rank][s] for s in range(max(0, end - 32), end)}
            reconciler.world.pods[uid] = dataclasses.replace(pod, step_times=wire.StepTimes(0, {rank: newest}))
        reconciler.evaluate(reconciler.world.jobs[job.key])


def timings(total: int, slow_rank: int | None = None, slow_from: int = 0, factor: float = 1.0,
            seed: int = 7) -> dict[int, list[float]]:
    """0.1 s a step with 5% noise; rank 0 does 30% extra work every 10th step (uneven by design)."""
    rng = random.Random(seed)
    found: dict[int, list[float]] = {}
    for rank in range(RANKS):
        values = []
        for step in range(total):
            value = 0.1 * rng.lognormvariate(0, 0.05) * (1.3 if rank == 0 and step % 10 == 0 else 1.0)
            values.append(value * (factor if rank == slow_rank and step >= slow_from else 1.0))
        found[rank] = values
    return found


def test_a_slow_rank_gets_one_event_the_metric_and_the_record_and_is_cleared_when_it_recovers() -> None:
    reconciler, calls, job = start("slowjob")
    seconds = timings(400, slow_rank=2, slow_from=100, factor=1.5)
    for step in range(250, 400):  # it recovers
        seconds[2][step] = seconds[1][step]
    play(reconciler, job, range(0, 100), seconds)
    assert not [c for c in calls if c[0] == "event"]
    play(reconciler, job, range(100, 160), seconds)
    flagged = [c for c in calls if c == ("event", "KcoverStraggler")]
    assert len(flagged) == 1
    recorded = decode(current(reconciler, job)[0].annotations[STRAGGLERS])
    assert [(s["rank"], s["node"], s["pod"]) for s in recorded] == [(2, "n2", "p2")]
    assert 1.35 < float(str(recorded[0]["slowdown"])) < 1.65 and int(str(recorded[0]["since_step"])) >= 100
    value = slowdown("ns", "slowjob", "n2", 2)
    assert value is not None and 1.35 < value < 1.65
    play(reconciler, job, range(160, 400), seconds)
    events = [c for c in calls if c[0] == "event"]
    assert events == [("event", "KcoverStraggler"), ("event", "KcoverStragglerRecovered")]
    assert decode(current(reconciler, job)[0].annotations[STRAGGLERS]) == []
    assert slowdown("ns", "slowjob", "n2", 2) is None
    assert len([c for c in calls if c[0] == "stragglers"]) == 2  # written on each change only


def test_an_uneven_healthy_job_is_never_flagged_over_2000_steps() -> None:
    reconciler, calls, job = start("uneven")
    play(reconciler, job, range(0, 2000), timings(2000, seed=11), every=8)
    assert not [c for c in calls if c[0] in ("event", "stragglers")]


def test_a_restart_learns_afresh_and_clears_what_the_last_attempt_flagged() -> None:
    reconciler, calls, job = start("restarted")
    play(reconciler, job, range(0, 160), timings(160, slow_rank=3, slow_from=60, factor=2.0))
    assert ("event", "KcoverStraggler") in calls and slowdown("ns", "restarted", "n3", 3) is not None
    record = RecoveryRecord(attempt=2)
    fresh = dataclasses.replace(current(reconciler, job)[0], annotations={
        **current(reconciler, job)[0].annotations, "kcover.io/recovery": record.to_annotation()})
    reconciler.world.jobs[job.key] = fresh
    reconciler.evaluate(fresh)
    assert slowdown("ns", "restarted", "n3", 3) is None
    assert decode(current(reconciler, job)[0].annotations[STRAGGLERS]) == []
    assert calls[-2:] == [("event", "KcoverStragglerRecovered"), ("stragglers", "[]")]


def test_a_new_leader_clears_stragglers_an_earlier_one_recorded_and_bad_records_read_as_none() -> None:
    reconciler, calls, job = start("inherited")
    earlier = json.dumps([{"rank": 1, "node": "n1", "pod": "p1", "slowdown": 1.4, "since_step": 50}])
    fresh = dataclasses.replace(job, annotations={**job.annotations, STRAGGLERS: earlier})
    reconciler.world.jobs[job.key] = fresh
    reconciler.evaluate(fresh)
    assert calls == [("stragglers", "[]")]
    for text in (None, "", "x", "{}", "[" * 100_000, json.dumps([{"rank": "1"}, {"rank": 1, "node": 5},
                                                                 {"rank": 1, "node": "n", "slowdown": True},
                                                                 {"rank": 1, "node": "n", "slowdown": 1e400}])):
        assert decode(text) == []


def test_step_times_that_are_bad_or_of_another_generation_are_not_fed() -> None:
    for text in (None, "", "[]", '{"generation": -1, "ranks": {}}', '{"generation": 0, "ranks": []}',
                 '{"generation": 0}', "x" * 300_000):
        assert wire.StepTimes.decode(text) is None
    mixed = json.dumps({"generation": 0, "ranks": {"x": [[1, 0.1]], "1": [[1, 0.1], [2, "a"], [3, -1], [4, 1e9],
                                                                          [-5, 0.1], [6], [7, True], [8, 0.2]],
                                                   "99999999": [[1, 0.1]], "2": "no"}})
    assert wire.StepTimes.decode(mixed) == wire.StepTimes(0, {1: {1: 0.1, 8: 0.2}})
    pod = kcover_pod("p0", "n0", generation=1)
    assert dataclasses.replace(pod, step_times=wire.StepTimes(0, {0: {1: 0.1}})).times is None
    assert dataclasses.replace(pod, step_times=wire.StepTimes(1, {0: {1: 0.1}})).times is not None


def replacing(total_steps: str | None, spares: int, name: str) -> tuple[Reconciler, list[tuple[str, object]], JobView]:
    """A job asking for ``replace``, created 600 s ago, its run's first step 60 s later, a checkpoint at step 96."""
    reconciler, actions = fake_reconciler()
    actions.spares = spares
    body = job_body(name=name)
    body["metadata"]["annotations"] |= {STRAGGLER_ACTION: "replace"} | (
        {TOTAL_STEPS: total_steps} if total_steps is not None else {})
    created = reconciler.clock.now() - dt.timedelta(seconds=600)
    body["metadata"]["creationTimestamp"] = created.isoformat()
    run = PodProgress(created.timestamp() + 60, None, 96, created.timestamp() + 80)
    job = put(reconciler, job_view("Job", body), *(dataclasses.replace(
        kcover_pod(f"p{r}", f"n{r}"), job=("Job", name), progress=dataclasses.replace(run, generation=0))
        for r in range(RANKS)))
    return reconciler, actions.calls, job


def test_replace_restarts_the_job_without_the_slow_node_when_it_pays() -> None:
    reconciler, calls, job = replacing("100000", 1, "paying")
    play(reconciler, job, range(0, 200), timings(200, slow_rank=1, slow_from=100, factor=1.5))
    _, record = current(reconciler, job)
    assert record.phase is RecoveryPhase.RESTARTING and record.last is not None
    assert record.last.rule == "job.straggler" and record.quarantine == ("n1",)
    assert record.method is not RestartMethod.IN_PLACE  # the node is blamed: the pods go, not just the workers
    assert ("spare_nodes", RANKS) in calls and ("quarantine", "n1") in calls
    flagged = decode(current(reconciler, job)[0].annotations[STRAGGLERS])
    assert str(flagged[0]["judgement"]).startswith("replacing its node: gain ")
    # the gain: ~99,800 steps left at 0.15 s, a third of it saved; the cost: 60 s to the first step + redo
    gain, cost = (float(x) for x in re.findall(r"([\d.]+)s", str(flagged[0]["judgement"])))
    assert 4000 < gain < 6000 and 60 < cost < 80


def test_replace_reports_only_without_a_spare_without_total_steps_or_when_it_does_not_pay() -> None:
    for total, spares, why in (("100000", 0, "no spare node to replace it with; reporting only"),
                               (None, 1, "remaining steps unknown (give kcover.io/total-steps); reporting only"),
                               ("210", 1, "not worth a restart: gain ")):
        name = f"report-{spares}-{total}"
        reconciler, calls, job = replacing(total, spares, name)
        play(reconciler, job, range(0, 200), timings(200, slow_rank=1, slow_from=100, factor=1.5))
        _, record = current(reconciler, job)
        assert record.phase is RecoveryPhase.RUNNING and "claim" not in [c[0] for c in calls]
        flagged = decode(current(reconciler, job)[0].annotations[STRAGGLERS])
        assert [f["rank"] for f in flagged] == [1] and str(flagged[0]["judgement"]).startswith(why), flagged
        reconciler.straggling.watch.forget(job.key)
        metric_cleanup(name)


def metric_cleanup(job: str) -> None:
    for rank in range(RANKS):
        with contextlib.suppress(KeyError):
            STRAGGLER.remove("ns", job, f"n{rank}", str(rank))


def test_a_bad_straggler_annotation_is_reported_and_the_default_applies() -> None:
    reconciler, actions = fake_reconciler()
    body = job_body(name="badly")
    body["metadata"]["annotations"] |= {STRAGGLER_ACTION: "explode", TOTAL_STEPS: "-1"}
    job = put(reconciler, job_view("Job", body))
    policy = reconciler.policy(job)
    assert policy.straggler_action.value == "report" and policy.total_steps is None
    assert actions.calls.count(("event", "KcoverBadAnnotation")) == 2


def test_a_replacement_whose_claim_conflicts_is_claimed_on_the_next_look() -> None:
    """Another writer changed the job between the look and the claim (here: the claim refused once): the judged
    replacement is kept and claimed next time, though the straggler is no longer new."""
    reconciler, calls, job = replacing("100000", 1, "conflicted")
    actions = reconciler.actions
    assert isinstance(actions, FakeActions)
    actions.conflict = True
    with contextlib.suppress(Conflict):
        play(reconciler, job, range(0, 200), timings(200, slow_rank=1, slow_from=100, factor=1.5))
    assert current(reconciler, job)[1].phase is RecoveryPhase.RUNNING and "claim" not in [c[0] for c in calls]
    actions.conflict = False
    reconciler.evaluate(reconciler.world.jobs[job.key])
    _, record = current(reconciler, job)
    assert record.phase is RecoveryPhase.RESTARTING and record.quarantine == ("n1",)
    assert calls.count(("event", "KcoverStraggler")) == 1


def test_a_straggler_never_fails_a_job_whose_restart_budget_is_spent() -> None:
    reconciler, calls, job = replacing("100000", 1, "spent")
    body_annotations = {**job.annotations, "kcover.io/max-restarts": "0"}
    reconciler.world.jobs[job.key] = dataclasses.replace(job, annotations=body_annotations)
    play(reconciler, job, range(0, 200), timings(200, slow_rank=1, slow_from=100, factor=1.5))
    _, record = current(reconciler, job)
    assert record.phase is RecoveryPhase.RUNNING and not {"claim", "fail"} & {c[0] for c in calls}
    assert calls.count(("event", "KcoverStraggler")) == 2  # flagged (replacing judged worth it), then not done
    assert reconciler.straggling.watch.replacing(job.key) is None
    metric_cleanup("spent")


def test_pods_that_write_their_step_times_later_are_expected_from_then_on() -> None:
    """The first looks see two pods' ranks only (the others' agents have not written yet): the slow rank of a
    pod that comes later is still judged and flagged."""
    reconciler, _, job = start("late")
    seconds = timings(300, slow_rank=3, slow_from=150, factor=1.5)
    for end in range(4, 33, 4):  # pods 0 and 1 alone for 32 steps
        for rank in (0, 1):
            pod = reconciler.world.pods[f"uid-p{rank}"]
            reconciler.world.pods[f"uid-p{rank}"] = dataclasses.replace(pod, step_times=wire.StepTimes(0, {rank: {
                s: seconds[rank][s] for s in range(max(0, end - 32), end)}}))
        reconciler.evaluate(reconciler.world.jobs[job.key])
    play(reconciler, job, range(32, 300), seconds)
    flagged = decode(current(reconciler, job)[0].annotations[STRAGGLERS])
    assert [(f["rank"], f["node"]) for f in flagged] == [(3, "n3")]
    metric_cleanup("late")


def test_replace_that_could_not_move_the_rank_off_its_node_reports_only() -> None:
    reconciler, calls, job = replacing("100000", 1, "stuck")
    fresh = dataclasses.replace(job, annotations={**job.annotations, "kcover.io/exclude-nodes": "false"})
    reconciler.world.jobs[job.key] = fresh
    play(reconciler, job, range(0, 200), timings(200, slow_rank=1, slow_from=100, factor=1.5))
    _, record = current(reconciler, job)
    assert record.phase is RecoveryPhase.RUNNING and not {"claim", "quarantine"} & {c[0] for c in calls}
    assert calls.count(("event", "KcoverStraggler")) == 2
    metric_cleanup("stuck")


def test_a_deleted_job_takes_its_watch_and_gauges_with_it() -> None:
    reconciler, _, job = start("deleted")
    play(reconciler, job, range(0, 160), timings(160, slow_rank=2, slow_from=60, factor=2.0))
    assert slowdown("ns", "deleted", "n2", 2) is not None
    del reconciler.world.jobs[job.key]
    reconciler.evaluate_due()
    assert slowdown("ns", "deleted", "n2", 2) is None and job.key not in reconciler.straggling.watch.jobs
