"""A job's ETTR as the operator and ``kcover status`` see it, and the ``kcover_job_ettr`` metric.

The accounting is :mod:`kcover.k8s.progress`'s; this module only picks its
inputs from a job, its recovery record and its pods: the productive seconds of
the runs that ended in a restart (kept on the record), the live run's (the
current attempt's pods, unless a restart is under way or kcover gave the job
up), from the job's first creation to its end or now.

The metric is computed at each scrape from what the operator's watches hold
(:class:`EttrCollector`), so it is never stale and costs no API write.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from kcover.k8s.operator.assess import current_pods
from kcover.k8s.operator.record import RecoveryPhase, RecoveryRecord
from kcover.k8s.operator.views import JobView, PodView
from kcover.k8s.progress import Ettr, closed_run, job_ettr, live_run


def ettr_of(job: JobView, record: RecoveryRecord, pods: Sequence[PodView], now: float) -> Ettr | None:
    """The job's ETTR up to its end (or ``now``); None when its creation time is unknown.

    The live run counts up to now while the job runs, and to its end when it succeeded; a job that failed by
    itself keeps its last run's work up to the checkpoint every pod has, one kcover gave up on what the record
    closed then (its end is when kcover gave up), one restarting what the claim closed.
    """
    began = record.began.timestamp() if record.began else job.created
    until = job.ended if job.ended is not None else now
    if record.phase is RecoveryPhase.FAILED and record.ended is not None:
        until = min(until, record.ended.timestamp())
    since = record.restarted_at.timestamp() if record.restarted_at else job.created
    runs = [p.run for p in current_pods(record, pods)]
    live = 0.0
    if record.phase is RecoveryPhase.RUNNING and (not job.finished or job.succeeded):
        live = live_run(runs, until, since)
    elif record.phase is RecoveryPhase.RUNNING:
        live = closed_run(runs, since, until)
    return job_ettr(began, until, record.productive, live)


Snapshot = Callable[[], tuple[list[JobView], list[PodView]]]
"""The operator's current view: opted-in jobs and every pod it watches."""


class EttrCollector(Collector):
    """``kcover_job_ettr{kind,namespace,job}`` for every opted-in job, computed when scraped."""

    def __init__(self, snapshot: Snapshot, clock: Callable[[], float] = time.time) -> None:
        self.snapshot = snapshot
        self.clock = clock

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily("kcover_job_ettr", "Effective training time ratio of the job so far: productive "
                                   "seconds (first step to last checkpoint of each run) over seconds since it was "
                                   "created", labels=["kind", "namespace", "job"])
        jobs, pods = self.snapshot()
        now = self.clock()
        by_job: dict[tuple[str, str, str], list[PodView]] = defaultdict(list)
        for pod in pods:
            if pod.job is not None:
                by_job[(pod.namespace, *pod.job)].append(pod)
        for job in jobs:
            if not job.opted_in:
                continue
            ettr = ettr_of(job, RecoveryRecord.from_annotation(job.recovery_annotation),
                           by_job.get((job.namespace, job.kind.kind, job.name), []), now)
            if ettr is not None:
                family.add_metric([job.kind.kind, job.namespace, job.name], ettr.ratio)
        yield family

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(())
