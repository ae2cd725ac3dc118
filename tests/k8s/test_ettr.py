"""ETTR on Kubernetes: the pods' progress records, the accounting, the operator's record and metric.

The agent's side (the real agent writing ``kcover.io/progress`` from
``kcover pod``'s lines) is ``test_agent_generations``; ``kcover status`` against
the real API server is ``test_status_ettr``.  Here: the pure parts with every
hostile annotation value, the saga closing each run into the record, and the
metric as Prometheus scrapes it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json

import pytest
from prometheus_client import CollectorRegistry
from tests.k8s.test_in_place import arrive, crashed_job, settle
from tests.k8s.test_reconcile import XID, FakeClock, current, fake_reconciler, job_body, pod_body, put

from kcover.k8s.names import PROGRESS
from kcover.k8s.operator.ettr import EttrCollector, ettr_of
from kcover.k8s.operator.record import RecoveryPhase, RecoveryRecord
from kcover.k8s.operator.views import PodView, job_view, pod_view
from kcover.k8s.progress import PodProgress, closed_run, job_ettr, live_run

T0 = 1_796_000_000.0  # 2026-11-30


def test_progress_round_trips_and_every_bad_annotation_reads_as_none() -> None:
    progress = PodProgress(T0, 3, 120, T0 + 60.5)
    assert PodProgress.decode(progress.encode()) == progress
    assert PodProgress.decode(PodProgress(T0).encode()) == PodProgress(T0)
    for text in (None, "", "not json", "[]", "{}", '{"first": "x"}', '{"first": true}', '{"first": NaN}',
                 '{"first": Infinity}', '{"first": -1}', '{"first": 0}', '{"first": 5e9}',
                 '{"first": ' + "9" * 400 + "}", '{"first": ' + "9" * 5000 + "}", "[" * 100_000,
                 '{"first": 1796000000, "pad": "' + "x" * (1 << 20) + '"}'):
        assert PodProgress.decode(text) is None, text[:40] if text else text
    # a checkpoint before the first step, or half of one, is no checkpoint; a bad generation is none
    assert PodProgress.decode(json.dumps({"first": T0, "checkpoint": 5, "checkpoint_at": T0 - 1})) == PodProgress(T0)
    assert PodProgress.decode(json.dumps({"first": T0, "checkpoint": 5})) == PodProgress(T0)
    assert PodProgress.decode(json.dumps({"first": T0, "checkpoint": -5, "checkpoint_at": T0 + 1})) == PodProgress(T0)
    assert PodProgress.decode(json.dumps({"first": T0, "generation": -1})) == PodProgress(T0)
    assert PodProgress.decode(json.dumps({"first": T0, "generation": 10**400})) == PodProgress(T0)


def test_a_failed_run_is_productive_to_the_checkpoint_every_pod_has() -> None:
    assert closed_run([]) == 0.0 and closed_run([None, None]) == 0.0
    a = PodProgress(T0 + 2, 0, 200, T0 + 100)
    b = PodProgress(T0, 0, 100, T0 + 50)  # the earliest first step, the oldest newest checkpoint
    assert closed_run([a, b, None]) == 50.0  # a pod that never stepped has nothing to lose
    assert closed_run([a, PodProgress(T0)]) == 0.0  # a pod that stepped without a checkpoint: all redone
    assert live_run([a, b, None], T0 + 300) == 300.0 and live_run([None], T0) == 0.0
    assert live_run([a], T0) == 0.0  # a step "after" until (clocks): never negative


def test_ettr_is_bounded_whatever_the_inputs() -> None:
    assert job_ettr(None, T0, 0, 10) is None
    assert job_ettr(T0, T0, 0, 10) is None and job_ettr(T0 + 5, T0, 0, 10) is None
    ettr = job_ettr(T0, T0 + 100, 30, 40)
    assert ettr is not None and ettr.ratio == pytest.approx(0.7)
    for closed, live in ((float("nan"), 10), (float("inf"), 10), (-50, 10), (500, 500)):
        ettr = job_ettr(T0, T0 + 100, closed, live)
        assert ettr is not None and 0 <= ettr.ratio <= 1 and ettr.productive <= ettr.wall


def test_the_record_keeps_productive_seconds_and_the_first_creation_and_refuses_bad_values() -> None:
    record = RecoveryRecord(productive=12.5, began=dt.datetime(2026, 12, 1, tzinfo=dt.UTC))
    again = RecoveryRecord.from_annotation(record.to_annotation())
    assert again.productive == 12.5 and again.began == record.began
    assert RecoveryRecord.from_annotation(json.dumps({"attempt": 2})).productive == 0.0  # an older operator's
    for value in ("-5", "true", '"12"', "1e400", "9" * 400, "NaN", "Infinity", "1e11"):
        assert RecoveryRecord.from_annotation('{"productive": ' + value + "}").productive == 0.0, value


def progress_pod(name: str, node: str, progress: PodProgress | None, phase: str = "Running") -> PodView:
    body = pod_body(name, "", node, phase)
    if progress is not None:
        body["metadata"]["annotations"][PROGRESS] = progress.encode()
    return pod_view(body)


def test_ettr_of_a_job_counts_the_live_run_only_while_it_runs() -> None:
    body = job_body()
    body["metadata"]["creationTimestamp"] = "2026-11-30T00:00:00Z"
    created = dt.datetime(2026, 11, 30, tzinfo=dt.UTC).timestamp()
    job = job_view("Job", body)
    assert job.created == created and job.ended is None
    pods = [progress_pod("p0", "n0", PodProgress(created + 100)), progress_pod("p1", "n1", None)]
    record = RecoveryRecord(productive=50.0)
    ettr = ettr_of(job, record, pods, created + 1000)
    assert ettr is not None and ettr.productive == 950.0 and ettr.wall == 1000.0
    restarting = ettr_of(job, dataclasses.replace(record, phase=RecoveryPhase.RESTARTING), pods, created + 1000)
    assert restarting is not None and restarting.productive == 50.0
    replaced = ettr_of(job, dataclasses.replace(record, replaced=("uid-p0",)), pods, created + 1000)
    assert replaced is not None and replaced.productive == 50.0  # the old attempt's pod is no live run
    began = dt.datetime.fromtimestamp(created - 1000, dt.UTC)  # a replaced batch Job: the first creation counts
    first = ettr_of(job, dataclasses.replace(record, began=began), pods, created + 1000)
    assert first is not None and first.wall == 2000.0
    body["status"] = {"completionTime": "2026-11-30T00:10:00Z",
                      "conditions": [{"type": "Complete", "status": "True"}]}
    done = ettr_of(job_view("Job", body), record, pods, created + 99_999)
    assert done is not None and done.wall == 600.0 and done.productive == 550.0
    body["metadata"]["creationTimestamp"] = "not a time"
    assert ettr_of(job_view("Job", body), record, pods, created + 1000) is None


def test_each_restart_closes_its_run_into_the_record_once() -> None:
    clock = FakeClock()
    reconciler, _ = fake_reconciler(clock)
    created = clock.now().timestamp() - 600
    job = crashed_job(reconciler)
    job = dataclasses.replace(job, created=created)
    reconciler.world.jobs[job.key] = job
    for uid, pod in list(reconciler.world.pods.items()):  # both pods stepped; p0's checkpoint is the older
        checkpoint = (100, created + 300) if pod.name == "p0" else (150, created + 400)
        reconciler.world.pods[uid] = dataclasses.replace(pod, progress=PodProgress(created + 60, 0, *checkpoint))
    settle(reconciler, clock, job)
    _, record = current(reconciler, job)
    assert record.phase is RecoveryPhase.RESTARTING and record.productive == 240.0
    assert record.began == dt.datetime.fromtimestamp(created, dt.UTC)
    settle(reconciler, clock, job)  # the order is replayed, the run is not closed again
    assert current(reconciler, job)[1].productive == 240.0
    arrive(reconciler, 1, "p0", "p1")
    settle(reconciler, clock, job)
    fresh, record = current(reconciler, job)
    assert record.phase is RecoveryPhase.RUNNING and record.productive == 240.0
    now = clock.now().timestamp()
    ettr = ettr_of(fresh, record, list(reconciler.world.pods.values()), now)
    assert ettr is not None and ettr.productive == 240.0  # generation 1 has not stepped yet
    assert ettr.wall == pytest.approx(now - created)


def test_the_metric_is_computed_when_scraped_for_opted_in_jobs_only() -> None:
    body = job_body(name="train")
    body["metadata"]["creationTimestamp"] = "2026-11-30T00:00:00Z"
    created = dt.datetime(2026, 11, 30, tzinfo=dt.UTC).timestamp()
    other = job_body(name="other")
    other["metadata"]["labels"] = {}
    other["metadata"]["creationTimestamp"] = "2026-11-30T00:00:00Z"
    jobs = [job_view("Job", body), job_view("Job", other), job_view("Job", job_body(name="unborn"))]
    pods = [progress_pod("p0", "n0", PodProgress(created + 250))]
    registry = CollectorRegistry()
    registry.register(EttrCollector(lambda: (jobs, pods), clock=lambda: created + 1000))
    labels = {"kind": "Job", "namespace": "ns"}
    assert registry.get_sample_value("kcover_job_ettr", {**labels, "job": "train"}) == 0.75
    assert registry.get_sample_value("kcover_job_ettr", {**labels, "job": "other"}) is None  # not opted in
    assert registry.get_sample_value("kcover_job_ettr", {**labels, "job": "unborn"}) is None  # no creation time


def test_a_job_whose_pods_never_stepped_has_an_ettr_of_zero() -> None:
    clock = FakeClock()
    reconciler, _ = fake_reconciler(clock)
    body = job_body()
    body["metadata"]["creationTimestamp"] = "2026-12-01T11:00:00Z"
    job = put(reconciler, job_view("Job", body), progress_pod("p0", "n0", None))
    ettr = ettr_of(job, RecoveryRecord(), list(reconciler.world.pods.values()), clock.now().timestamp())
    assert ettr is not None and ettr.ratio == 0.0 and ettr.wall == 3600.0


def test_a_run_is_clamped_to_its_own_time_whatever_a_pod_annotation_says() -> None:
    forged = PodProgress(T0 - 10**6, 0, 5, T0 + 10**8)  # a first step long before, a checkpoint in 2029
    assert closed_run([forged], since=T0, until=T0 + 100) == 100.0
    assert live_run([forged], T0 + 100, since=T0) == 100.0
    assert closed_run([PodProgress(T0 + 200, 0, 5, T0 + 300)], since=T0, until=T0 + 100) == 0.0


def test_a_job_kcover_gives_up_keeps_its_last_runs_work_and_its_ettr_stops_there() -> None:
    clock = FakeClock()
    reconciler, actions = fake_reconciler(clock)
    created = clock.now().timestamp() - 600
    body = job_body()
    body["metadata"]["annotations"]["kcover.io/max-restarts"] = "0"
    job = dataclasses.replace(job_view("Job", body), created=created)
    put(reconciler, job, *(dataclasses.replace(pod_view(pod_body(f"p{r}", XID if r == 0 else "", f"n{r}")),
                                               progress=PodProgress(created + 60, None, 90, created + 360))
                           for r in range(2)))
    settle(reconciler, clock, job)
    fresh, record = current(reconciler, job)
    assert ("fail", record.last.decision if record.last else None) in actions.calls
    assert record.phase is RecoveryPhase.FAILED and record.productive == 300.0 and record.ended == clock.now()
    clock.advance(10_000)  # the job stays suspended: its ETTR does not fall
    ettr = ettr_of(fresh, record, list(reconciler.world.pods.values()), clock.now().timestamp())
    assert ettr is not None and ettr.productive == 300.0 and ettr.wall == pytest.approx(605.0)


def test_a_job_that_failed_by_itself_keeps_its_last_run_up_to_the_checkpoint_only() -> None:
    body = job_body()
    body["metadata"]["creationTimestamp"] = "2026-11-30T00:00:00Z"
    created = dt.datetime(2026, 11, 30, tzinfo=dt.UTC).timestamp()
    pods = [progress_pod("p0", "n0", PodProgress(created + 100, None, 50, created + 400))]
    body["status"] = {"conditions": [{"type": "Failed", "status": "True",
                                      "lastTransitionTime": "2026-11-30T00:10:00Z"}]}
    failed = ettr_of(job_view("Job", body), RecoveryRecord(), pods, created + 99_999)
    assert failed is not None and failed.wall == 600.0 and failed.productive == 300.0
