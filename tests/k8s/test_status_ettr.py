"""A job's ETTR from the real API server: ``kcover status`` and the operator's ``kcover_job_ettr`` metric.

The job's record holds the productive seconds of its earlier runs and its
first creation (as the operator writes them); its pods hold their progress (as
the agent writes it, one of them garbage, as anyone who may patch a pod could
write it).  Both readers must give the same ratio, within the time the reads
took.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import time
from pathlib import Path
from typing import Any

from kubernetes import client
from tests.k8s.conftest import Processes, indexed_job, metric_samples, wait_until
from tests.k8s.test_agent_health import kcover_status, scrape

from kcover.k8s.names import PROGRESS, RECOVERY
from kcover.k8s.operator.record import RecoveryRecord
from kcover.k8s.progress import PodProgress
from kcover.ports import free_port
from kcover.testing import TestCluster

EARLIER = 30.0  # productive seconds of the runs before this one


def bounds(began: float, first: float, before: float, after: float) -> tuple[float, float]:
    """The lowest and highest ETTR a reader between ``before`` and ``after`` can give."""
    return (EARLIER + before - first) / (after - began), (EARLIER + after - first) / (before - began)


def ettr_samples(text: str, namespace: str) -> dict[str, float]:
    """``kcover_job_ettr`` per job of ``namespace`` in a scrape."""
    return {labels["job"]: value for labels, value in metric_samples(text, "kcover_job_ettr")
            if labels.get("namespace") == namespace and labels.get("kind") == "Job"}


def test_status_and_the_metric_give_each_jobs_ettr_from_its_record_and_its_pods(
        test_cluster: TestCluster, k8s_api: Any, test_namespace: str, gpu_nodes: list[str],
        kcover_processes: Processes, tmp_path: Path) -> None:
    core, batch = client.CoreV1Api(k8s_api), client.BatchV1Api(k8s_api)
    created = batch.create_namespaced_job(test_namespace, indexed_job("etr", test_namespace, 2))
    batch.create_namespaced_job(test_namespace, indexed_job("plain", test_namespace, 1, opted_in=False))
    began = created.metadata.creation_timestamp.timestamp() - 100  # first created before a replacement
    record = RecoveryRecord(productive=EARLIER, began=dt.datetime.fromtimestamp(began, dt.UTC), restarts=1,
                            restarted_at=dt.datetime.fromtimestamp(began + 50, dt.UTC))  # this run began then
    batch.patch_namespaced_job("etr", test_namespace,
                               {"metadata": {"annotations": {RECOVERY: record.to_annotation()}}})
    pods = wait_until(lambda: (found := [p for p in core.list_namespaced_pod(
        test_namespace, label_selector="batch.kubernetes.io/job-name=etr").items if p.status.phase == "Running"])
        and len(found) == 2 and found, 30, "two pods Running")
    first = time.time() - 20
    for pod, text in zip(pods, (PodProgress(first).encode(), '{"first": NaN, "x": ' + "9" * 5000 + "}"),
                         strict=True):
        core.patch_namespaced_pod(pod.metadata.name, test_namespace,
                                  {"metadata": {"annotations": {PROGRESS: text}}})

    before = time.time()
    status = kcover_status(test_cluster, "--json")
    after = time.time()
    jobs = {job["name"]: job for job in status["jobs"] if job["namespace"] == test_namespace}
    assert set(jobs) == {"etr"}
    low, high = bounds(began, first, before, after)
    assert low - 1e-4 <= jobs["etr"]["ettr"] <= high + 1e-4
    assert jobs["etr"]["wall_seconds"] >= 100 and jobs["etr"]["productive_seconds"] >= EARLIER + 20
    table = kcover_status(test_cluster)
    assert re.search(rf"{test_namespace}/etr\s+\S+\s+1\s+0\.\d\d", table), table

    port = free_port()
    kcover_processes.start(["operator", "--kubeconfig", str(test_cluster.kubeconfig), "--namespace",
                            test_namespace, "--lease-seconds", "3", "--metrics-port", str(port)],
                           tmp_path / "operator.log")

    def scraped() -> dict[str, float] | None:
        """The samples once the operator's watches hold the job and its pods: a scrape between ``before`` and
        ``after`` whose ETTR is the one expected then (until the pods are seen, only the record counts)."""
        before = time.time()
        found = ettr_samples(scrape(port), test_namespace)
        low, high = bounds(began, first, before, time.time())
        return found if "etr" in found and low - 1e-4 <= found["etr"] <= high + 1e-4 else None

    found = wait_until(scraped, 60, "the metric to count the job's record and its pods")
    assert set(found) == {"etr"}  # the job not opted in has none
    assert json.loads(batch.read_namespaced_job("etr", test_namespace).metadata.annotations[RECOVERY])[
        "productive"] == EARLIER  # reading ETTR writes nothing
