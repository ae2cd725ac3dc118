"""Restarting a batch Job whose pods failed: replace the Job object, because its controller would wait.

The Job controller remembers every failed pod of a Job (in memory, even the
ones a ``podFailurePolicy`` ignores) and delays new pods by 10 s × 2^(failures
− 1), up to 6 minutes: a 64-rank job whose ranks all crashed would wait the
maximum.  Suspending and resuming does not reset that record; only a new Job
does.  So for a batch Job with Failed pods (and no controller of its own, such
as a CronJob) the restart is:

1. **save**: a ConfigMap ``kcover-recreate-<job>`` (label
   ``kcover.io/recreate-for``, no owner) holds the Job's manifest, cleaned of
   what the API server and the Job controller filled in, with the recovery
   state already marked done; the evidence ConfigMaps are detached from the
   Job so that deleting it does not delete them;
2. **delete** the Job with foreground propagation: its pods get their grace
   period (SIGTERM, emergency checkpoint) and the Job object goes only after them;
3. **create** the Job again from the saved manifest once the old one is gone,
   hand the evidence to it, and drop the ConfigMap.

Step 3 is :meth:`Recreator.finish_pending`, which the leading operator runs
periodically: whatever replica is leading when the old Job disappears
finishes the restart, so a crash between delete and create never loses a Job.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kcover.k8s.names import EVIDENCE_LABEL, RECOVERY, STATE
from kcover.k8s.operator.record import RecoveryRecord

log = logging.getLogger("kcover.operator")
PENDING_LABEL = "kcover.io/recreate-for"
_GENERATED_LABELS = ("controller-uid", "batch.kubernetes.io/controller-uid", "job-name",
                     "batch.kubernetes.io/job-name")


def fresh_manifest(body: dict[str, Any], record: RecoveryRecord) -> dict[str, Any]:
    """The Job as its author would create it again: no status, identity or generated selector, not suspended."""
    meta = body["metadata"]
    annotations = {**(meta.get("annotations") or {}), RECOVERY: record.to_annotation(), STATE: "running"}
    spec = {k: v for k, v in body["spec"].items() if k != "suspend"}
    if not spec.get("manualSelector"):
        spec.pop("selector", None)
        template_meta = dict(spec["template"].get("metadata") or {})
        labels = {k: v for k, v in (template_meta.get("labels") or {}).items() if k not in _GENERATED_LABELS}
        spec["template"] = {**spec["template"], "metadata": {**template_meta, "labels": labels}}
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": meta["name"], "namespace": meta["namespace"], "labels": meta.get("labels") or {},
                     "annotations": annotations},
        "spec": spec,
    }


def controlled(body: dict[str, Any]) -> bool:
    """Whether another controller (a CronJob, a workflow) owns the Job: then kcover must not replace it."""
    return any(ref.get("controller") for ref in body["metadata"].get("ownerReferences") or [])


class Recreator:
    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self.core = client.CoreV1Api(api)
        self.batch = client.BatchV1Api(api)

    def read(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            job = self.batch.read_namespaced_job(name, namespace)
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        return dict(self.api.sanitize_for_serialization(job))

    def save_and_delete(self, body: dict[str, Any], done: RecoveryRecord) -> None:
        """Steps 1–2 (idempotent): keep the manifest (with ``done``, the finished restart's record), detach the
        evidence, delete the Job in the foreground."""
        meta = body["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        saved = client.V1ConfigMap(
            metadata=client.V1ObjectMeta(name=f"kcover-recreate-{name}"[:253], namespace=namespace,
                                         labels={PENDING_LABEL: name[:63]}),
            data={"job.json": json.dumps(fresh_manifest(body, done)), "old-uid": meta["uid"]},
        )
        try:
            self.core.create_namespaced_config_map(namespace, saved)
        except ApiException as error:
            if error.status != 409:
                raise
        self._own_evidence(namespace, name, None)
        try:
            self.batch.delete_namespaced_job(name, namespace, propagation_policy="Foreground")
        except ApiException as error:
            if error.status != 404:
                raise

    def finish_pending(self) -> tuple[list[dict[str, Any]], int]:
        """Step 3 for every saved Job whose old object is gone: the Jobs created again, and how many wait."""
        done: list[dict[str, Any]] = []
        waiting = 0
        for saved in self.core.list_config_map_for_all_namespaces(label_selector=PENDING_LABEL).items:
            namespace, manifest = saved.metadata.namespace, json.loads(saved.data["job.json"])
            name = manifest["metadata"]["name"]
            current = self.read(namespace, name)
            if current is not None and current["metadata"]["uid"] == saved.data.get("old-uid"):
                waiting += 1  # the old Job is still stopping its pods
                continue
            if current is None:
                try:
                    self.batch.create_namespaced_job(namespace, manifest)
                except ApiException as error:
                    if error.status != 409:
                        raise
                current = self.read(namespace, name)
                if current is not None:
                    done.append(current)
                log.info("Job %s/%s: created again", namespace, name)
            if current is not None:
                self._own_evidence(namespace, name, current["metadata"]["uid"])
            try:
                self.core.delete_namespaced_config_map(saved.metadata.name, namespace)
            except ApiException as error:
                if error.status != 404:
                    raise
        return done, waiting

    def _own_evidence(self, namespace: str, name: str, uid: str | None) -> None:
        """Detach the job's evidence ConfigMaps (uid None) or give them to the new Job."""
        owners = None if uid is None else [{"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": uid}]
        evidence = self.core.list_namespaced_config_map(namespace, label_selector=f"{EVIDENCE_LABEL}={name[:63]}")
        for item in evidence.items:
            self.core.patch_namespaced_config_map(item.metadata.name, namespace,
                                                  {"metadata": {"ownerReferences": owners}})
