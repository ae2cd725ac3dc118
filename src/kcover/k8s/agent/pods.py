"""Which pods on this node belong to opted-in jobs, and what each one is.

The agent lists its node's pods (``spec.nodeName``) every few seconds and asks,
per job, whether the job carries the opt-in label; answers are cached, so a
node with hundreds of pods costs one list call per refresh.  Pods of jobs that
did not opt in are never read, never annotated.  A job's ``kcover.io/hang-timeout``
annotation (seconds) is read at the same time, for the agent's hang detection.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kcover.k8s.kinds import BATCH_JOB, JobKind, job_of_pod
from kcover.k8s.names import HANG_TIMEOUT, OPT_IN_LABEL, OPT_IN_VALUE

REFRESH_SECONDS = 2.0
JOB_CACHE_SECONDS = 30.0


@dataclass(frozen=True)
class PodInfo:
    namespace: str
    name: str
    uid: str
    node: str
    kind: JobKind
    job: str
    rank: int | None
    hang_timeout: float | None = None


def job_meta(api: client.ApiClient, kind: JobKind, namespace: str, name: str) -> tuple[dict[str, str], dict[str, str]]:
    """The labels and annotations of a job of any supported kind (empty when it does not exist)."""
    try:
        if kind is BATCH_JOB:
            job = client.BatchV1Api(api).read_namespaced_job(name, namespace)
            return dict(job.metadata.labels or {}), dict(job.metadata.annotations or {})
        body: dict[str, Any] = client.CustomObjectsApi(api).get_namespaced_custom_object(
            kind.group, kind.version, namespace, kind.plural, name)
        meta = body.get("metadata", {})
        return dict(meta.get("labels") or {}), dict(meta.get("annotations") or {})
    except ApiException as error:
        if error.status == 404:
            return {}, {}
        raise


def _seconds(text: str | None) -> float | None:
    try:
        value = float(text) if text is not None else None
    except ValueError:
        return None
    return value if value is not None and value > 0 else None


def _rank(labels: dict[str, str], annotations: dict[str, str]) -> int | None:
    for key in ("batch.kubernetes.io/job-completion-index", "training.kubeflow.org/replica-index",
                "jobset.sigs.k8s.io/job-index"):
        value = annotations.get(key) or labels.get(key)
        if value is not None and value.isdigit():
            return int(value)
    return None


class PodDirectory:
    """The opted-in pods of one node, refreshed every :data:`REFRESH_SECONDS`."""

    def __init__(self, api: client.ApiClient, node: str) -> None:
        self.api = api
        self.node = node
        self.by_uid: dict[str, PodInfo] = {}
        self._refreshed = 0.0
        self._jobs: dict[tuple[str, str, str], tuple[bool, float | None, float]] = {}

    def refresh(self, force: bool = False) -> dict[str, PodInfo]:
        now = time.monotonic()
        if not force and now - self._refreshed < REFRESH_SECONDS:
            return self.by_uid
        self._refreshed = now
        pods = client.CoreV1Api(self.api).list_pod_for_all_namespaces(field_selector=f"spec.nodeName={self.node}")
        found: dict[str, PodInfo] = {}
        for pod in pods.items:
            labels = dict(pod.metadata.labels or {})
            owner = job_of_pod(labels)
            if owner is None:
                continue
            opted, hang_timeout = self._job(owner[0], pod.metadata.namespace, owner[1], now)
            if not opted:
                continue
            found[pod.metadata.uid] = PodInfo(pod.metadata.namespace, pod.metadata.name, pod.metadata.uid, self.node,
                                              owner[0], owner[1], _rank(labels, dict(pod.metadata.annotations or {})),
                                              hang_timeout)
        self.by_uid = found
        return found

    def _job(self, kind: JobKind, namespace: str, name: str, now: float) -> tuple[bool, float | None]:
        """Whether the job opted in, and its ``kcover.io/hang-timeout`` (cached)."""
        key = (kind.kind, namespace, name)
        cached = self._jobs.get(key)
        if cached is not None and now - cached[2] < JOB_CACHE_SECONDS:
            return cached[0], cached[1]
        labels, annotations = job_meta(self.api, kind, namespace, name)
        answer = labels.get(OPT_IN_LABEL) == OPT_IN_VALUE, _seconds(annotations.get(HANG_TIMEOUT))
        self._jobs[key] = (*answer, now)
        return answer
