"""The job kinds kcover recovers, and how to find each one's pods and stop it.

Pods are tied to their job through labels the job controllers set, so the
opt-in label on the job is enough (pods need not carry it):

- batch/v1 ``Job``: ``batch.kubernetes.io/job-name`` (Indexed or not);
- ``JobSet`` (jobset.x-k8s.io/v1alpha2): ``jobset.sigs.k8s.io/jobset-name``;
- Kubeflow ``PyTorchJob`` (kubeflow.org/v1): ``training.kubeflow.org/job-name``.

Failing a job fast suspends it (``spec.suspend`` / ``spec.runPolicy.suspend``),
so its own controller stops recreating pods.  Restarting uses each kind's native
way where deleting pods would be punished: a batch Job counts deleted pods as
failures and backs off for minutes, so a Job or JobSet is restarted by
suspending it (its controller stops every pod, with the pods' own grace period)
and resuming it once they are gone; a PyTorchJob's pods are deleted and its
controller recreates them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class JobKind:
    kind: str
    group: str
    version: str
    plural: str
    pod_label: str
    suspend_path: tuple[str, ...]
    restart_by_suspend: bool

    def suspend_patch(self, suspend: bool = True) -> dict[str, Any]:
        patch: dict[str, Any] = {self.suspend_path[-1]: suspend}
        for key in reversed(self.suspend_path[:-1]):
            patch = {key: patch}
        return patch

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def selector(self, name: str) -> str:
        return f"{self.pod_label}={name}"


BATCH_JOB = JobKind("Job", "batch", "v1", "jobs", "batch.kubernetes.io/job-name", ("spec", "suspend"), True)
JOBSET = JobKind("JobSet", "jobset.x-k8s.io", "v1alpha2", "jobsets", "jobset.sigs.k8s.io/jobset-name",
                 ("spec", "suspend"), True)
PYTORCHJOB = JobKind("PyTorchJob", "kubeflow.org", "v1", "pytorchjobs", "training.kubeflow.org/job-name",
                     ("spec", "runPolicy", "suspend"), False)

KINDS: dict[str, JobKind] = {kind.kind: kind for kind in (BATCH_JOB, JOBSET, PYTORCHJOB)}


def job_of_pod(labels: dict[str, str]) -> tuple[JobKind, str] | None:
    """The job a pod belongs to, by its labels (a JobSet's pods also carry a Job label: JobSet wins)."""
    for kind in (JOBSET, PYTORCHJOB, BATCH_JOB):
        name = labels.get(kind.pod_label)
        if name:
            return kind, name
    return None
