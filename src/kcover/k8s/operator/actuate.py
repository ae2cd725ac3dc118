"""Carrying a decision out through the API: claim, keep evidence, quarantine, restart or fail.

A restart is a small saga recorded in the job's ``kcover.io/recovery``
annotation, so that an operator that dies half-way, or a second replica, can
finish it exactly once:

1. **claim** — write the new state with ``phase: restarting`` and the restart
   time, conditional on the job's resourceVersion (a 409 means another replica
   acted first: stop);
2. **evidence** — a ConfigMap ``kcover-evidence-<job>-<attempt>`` (owned by
   the job) with the verdict and the last lines of every failing pod, before a
   pod is deleted (deleting pods used to delete the only copy of their logs);
3. **quarantine** the blamed nodes (never the cascade victims);
4. **stop the pods** listed in the claim, so SIGTERM lets workers write an
   emergency checkpoint: a Job or JobSet is suspended (its controller stops
   them, see :mod:`kcover.k8s.kinds`), a PyTorchJob's pods are deleted with a
   grace period, and a batch Job whose pods failed is replaced by a new Job
   (``method: recreate``, see :mod:`kcover.k8s.operator.recreate`) — for a
   JobSet whose pods failed, its child Jobs are deleted while it is suspended
   and its controller creates them afresh (``method: renew-children``);
5. **done** — ``phase: running`` (a suspended job is resumed, and its
   controller starts fresh pods).

An in-place restart (``method: in-place``) replaces steps 3–4: the new
generation is written on every pod (``kcover.io/generation``), the record moves
to ``step: ordered``, and it is done when every pod reports running it.

The claim records what steps 2–5 need (pods to replace, failing pods, nodes
to exclude), and those steps are idempotent, so
:meth:`~kcover.k8s.operator.reconcile.Reconciler.resume` replays them for a job
found in ``restarting``: a new leader keeps the evidence and quarantines even
when the old one died right after claiming.  The order of the steps lives in
the reconciler; this module is the Kubernetes side of its
:class:`~kcover.k8s.operator.reconcile.JobActions` seam.

Failing a job fast suspends it and says why in one line, in the same patch.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kcover.health.quarantine.kube import KubeQuarantine
from kcover.health.quarantine.policy import ANNOTATION_QUARANTINED, NodeDecision, QuarantinePolicy
from kcover.k8s.names import EVIDENCE_LABEL, FIELD_MANAGER, GENERATION, RANK, REASON, RECOVERY, STATE, STRAGGLERS
from kcover.k8s.operator.policy import GROUP, PLURAL, VERSION
from kcover.k8s.operator.reconcile import Conflict
from kcover.k8s.operator.record import RecoveryRecord
from kcover.k8s.operator.recreate import Recreator
from kcover.k8s.operator.views import JobView, PodView
from kcover.timestamps import rfc3339

log = logging.getLogger("kcover.operator")
EVIDENCE_LINES = 200
ORDER_THREADS = 16


class Actuator:
    """The saga's side effects on a real cluster (:class:`~kcover.k8s.operator.reconcile.JobActions`)."""

    def __init__(self, api: client.ApiClient, quarantine: KubeQuarantine) -> None:
        self.api = api
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.batch = client.BatchV1Api(api)
        self.quarantine = quarantine
        self.recreator = Recreator(api)

    # -- job annotations -------------------------------------------------------------------------
    def patch_job(self, job: JobView, patch: dict[str, Any], conditional: bool = False) -> str | None:
        """Patch the job (``conditional``: only at the resourceVersion read); its new resourceVersion."""
        if conditional:
            patch = {**patch, "metadata": {**patch.get("metadata", {}), "resourceVersion": job.resource_version}}
        kind = job.kind
        try:
            if kind.group == "batch":
                found = self.batch.patch_namespaced_job(job.name, job.namespace, patch, field_manager=FIELD_MANAGER)
                return str(found.metadata.resource_version or "") or None
            patched = self.custom.patch_namespaced_custom_object(kind.group, kind.version, job.namespace,
                                                                 kind.plural, job.name, patch)
            return str(((patched or {}).get("metadata") or {}).get("resourceVersion") or "") or None
        except ApiException as error:
            if error.status == 409:
                raise Conflict(f"{job.kind.kind} {job.namespace}/{job.name} changed") from None
            raise

    def policy_spec(self, namespace: str) -> dict[str, Any] | None:
        """The spec of the RecoveryPolicy ``default`` in a namespace, if there is one."""
        try:
            body = self.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "default")
        except ApiException:
            return None
        spec = body.get("spec") if isinstance(body, dict) else None
        return spec if isinstance(spec, dict) else {}

    def event(self, job: JobView, reason: str, message: str, warning: bool = False) -> None:
        now = rfc3339(dt.datetime.now(dt.UTC))
        body = client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name=f"{job.name}.kcover-", namespace=job.namespace),
            involved_object=client.V1ObjectReference(kind=job.kind.kind, name=job.name, namespace=job.namespace,
                                                     uid=job.uid, api_version=job.kind.api_version),
            reason=reason, message=message[:1000], type="Warning" if warning else "Normal",
            source=client.V1EventSource(component="kcover-operator"), first_timestamp=now, last_timestamp=now,
            count=1,
        )
        try:
            self.core.create_namespaced_event(job.namespace, body)
        except ApiException as error:
            log.warning("could not post event on %s/%s: %s", job.namespace, job.name, error.reason)

    # -- restart ---------------------------------------------------------------------------------
    def claim(self, job: JobView, record: RecoveryRecord, reason: str) -> None:
        """Step 1, conditional on the job's resourceVersion: :class:`Conflict` if another replica acted first."""
        patch = {"metadata": {"annotations": {RECOVERY: record.to_annotation(), STATE: "restarting",
                                              REASON: reason[:500]}}}
        self.patch_job(job, patch, conditional=True)

    def keep_evidence(self, job: JobView, record: RecoveryRecord, pods: Sequence[PodView]) -> None:
        failing = set(record.failing)
        name = f"kcover-evidence-{job.name}-{record.attempt - 1}"[:253]
        data = {"verdict.json": json.dumps(record.last.to_dict() if record.last else {}, indent=2)}
        for pod in pods:
            if pod.name not in failing:
                continue
            lines = [f.evidence.line for f in pod.faults]
            try:
                tail = self.core.read_namespaced_pod_log(pod.name, pod.namespace, tail_lines=EVIDENCE_LINES)
                lines.append(str(tail))
            except ApiException as error:
                lines.append(f"(container log unavailable: {error.status} {error.reason})")
            data[f"{pod.name}.log"] = "\n".join(lines)[-100_000:]
        owner = client.V1OwnerReference(api_version=job.kind.api_version, kind=job.kind.kind, name=job.name,
                                        uid=job.uid)
        body = client.V1ConfigMap(
            metadata=client.V1ObjectMeta(name=name, namespace=job.namespace, owner_references=[owner],
                                         labels={EVIDENCE_LABEL: job.name[:63]}),
            data=data,
        )
        try:
            self.core.create_namespaced_config_map(job.namespace, body)
        except ApiException as error:
            if error.status != 409:
                raise

    def delete_pods(self, pods: Sequence[PodView], replaced: Sequence[str], grace: int) -> int:
        """Delete the pods the restart replaces (those still there and not already going)."""
        deleted = 0
        doomed = set(replaced)
        for pod in pods:
            if pod.deleting or pod.uid not in doomed:
                continue
            try:
                self.core.delete_namespaced_pod(pod.name, pod.namespace, grace_period_seconds=grace)
                deleted += 1
            except ApiException as error:
                if error.status != 404:
                    raise
        return deleted

    def quarantine_node(self, node: str, reason: str, max_share: float) -> NodeDecision:
        self.quarantine.policy = QuarantinePolicy(max_share=max_share)
        return self.quarantine.quarantine(node, reason)

    def quarantined_count(self) -> int:
        return sum(n.quarantined_by_kcover for n in self.quarantine.nodes())

    def suspend_for_restart(self, job: JobView, record: RecoveryRecord) -> None:
        """Native restart, first half: suspend (the job's controller stops every pod), recording the step."""
        annotations = {RECOVERY: record.to_annotation()}
        self.patch_job(job, {**job.kind.suspend_patch(True), "metadata": {"annotations": annotations}})

    def delete_child_jobs(self, job: JobView) -> int:
        """A suspended JobSet whose pods failed: delete its child Jobs, which its controller creates afresh.

        The Job controller delays a Job's new pods after failed ones (10 s × 2^(n−1), up to 6 min) and
        only forgets that when the Job is deleted; the JobSet controller recreates missing child Jobs.
        """
        deleted = 0
        for child in self.batch.list_namespaced_job(job.namespace, label_selector=job.kind.selector(job.name)).items:
            if not any(ref.uid == job.uid for ref in child.metadata.owner_references or []):
                continue
            try:
                self.batch.delete_namespaced_job(child.metadata.name, job.namespace, propagation_policy="Background")
                deleted += 1
            except ApiException as error:
                if error.status != 404:
                    raise
        return deleted

    def order_generation(self, pods: Sequence[PodView], generation: int, ranks: Mapping[str, int]) -> None:
        """An in-place restart: write the new generation on every pod (``kcover pod`` in each reads it through
        the downward API), in parallel; pods that already carry it, or are gone, are skipped.  A standby in
        ``ranks`` (uid → rank) gets its rank in the same patch: the kubelet rewrites both files at once."""
        due = [p for p in pods if (p.ordered or 0) < generation]
        self._patch_pods([(p, {GENERATION: str(generation), **({RANK: str(ranks[p.uid])} if p.uid in ranks else {})})
                          for p in due])

    def assign_ranks(self, pods: Sequence[PodView], values: Mapping[str, str]) -> None:
        """A standby job's pods: their rank, ``standby`` or ``done`` (annotation for ``kcover pod``, label for a
        Service that selects rank 0's pod as ``MASTER_ADDR``)."""
        self._patch_pods([(p, {RANK: values[p.uid]}) for p in pods if p.uid in values])

    def _patch_pods(self, patches: Sequence[tuple[PodView, dict[str, str]]]) -> None:
        """Annotate pods in parallel (``kcover.io/rank`` also as a label); a pod gone meanwhile is skipped."""
        def patch(item: tuple[PodView, dict[str, str]]) -> None:
            pod, annotations = item
            body: dict[str, Any] = {"metadata": {"annotations": annotations}}
            if RANK in annotations:
                body["metadata"]["labels"] = {RANK: annotations[RANK]}
            try:
                self.core.patch_namespaced_pod(pod.name, pod.namespace, body, field_manager=FIELD_MANAGER)
            except ApiException as error:
                if error.status != 404:
                    raise

        if patches:
            with ThreadPoolExecutor(max_workers=min(ORDER_THREADS, len(patches))) as pool:
                list(pool.map(patch, patches))

    def note_stragglers(self, job: JobView, text: str) -> str | None:
        """The ranks flagged as stragglers now (``kcover.io/stragglers``; not guarded: only this replica writes
        it); the job's new resourceVersion."""
        return self.patch_job(job, {"metadata": {"annotations": {STRAGGLERS: text}}})

    def spare_nodes(self, selector: Mapping[str, str], busy: Collection[str]) -> int:
        """Nodes a replacement pod could go to: Ready, schedulable, not quarantined, with the labels of the pods'
        ``nodeSelector``, running none of the job's pods (whether a pod fits there is the scheduler's call)."""
        labels = ",".join(f"{key}={value}" for key, value in sorted(selector.items()))
        listed = self.core.list_node(label_selector=labels) if labels else self.core.list_node()
        spares = 0
        for node in listed.items:
            ready = any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])
            quarantined = ANNOTATION_QUARANTINED in (node.metadata.annotations or {})
            if ready and not node.spec.unschedulable and not quarantined and node.metadata.name not in busy:
                spares += 1
        return spares

    def write_record(self, job: JobView, record: RecoveryRecord) -> None:
        """The record of a restart under way, as its steps advance."""
        self.patch_job(job, {"metadata": {"annotations": {RECOVERY: record.to_annotation()}}})

    def finish_restart(self, job: JobView, record: RecoveryRecord) -> None:
        patch: dict[str, Any] = {"metadata": {"annotations": {RECOVERY: record.to_annotation(), STATE: "running"}}}
        if job.kind.restart_by_suspend:
            patch |= job.kind.suspend_patch(False)
        self.patch_job(job, patch)

    # -- fail fast -------------------------------------------------------------------------------
    def fail(self, job: JobView, record: RecoveryRecord, reason: str) -> None:
        patch: dict[str, Any] = {"metadata": {"annotations": {RECOVERY: record.to_annotation(), STATE: "failed",
                                                              REASON: reason[:500]}}}
        try:  # one patch: whoever sees phase "failed" also sees the job suspended
            self.patch_job(job, {**job.kind.suspend_patch(), **patch}, conditional=True)
        except ApiException as error:
            if error.status != 422:
                raise
            log.warning("could not suspend %s/%s: %s", job.namespace, job.name, error.reason)
            self.patch_job(job, patch, conditional=True)
        self.event(job, "KcoverFailed", f"kcover stopped recovering this job: {reason}", warning=True)

    # -- replacing a batch Job (see kcover.k8s.operator.recreate) ----------------------------------
    def read_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.recreator.read(namespace, name)

    def replace_job(self, body: dict[str, Any], record: RecoveryRecord) -> None:
        self.recreator.save_and_delete(body, record)

    def finish_replacements(self) -> tuple[list[dict[str, Any]], int]:
        return self.recreator.finish_pending()
