"""``kcover status``: what kcover is doing on this cluster, read back from the API.

Everything comes from the records kcover keeps on the objects themselves (the
job's ``kcover.io/recovery`` annotation, the nodes' ``kcover.io/quarantined``
and ``kcover.io/health``, the agent's last health run), so any replica, or a
person with read access, sees the same.  A job's ETTR adds its pods' progress
(``kcover.io/progress``) to the record's (:mod:`kcover.k8s.operator.ettr`).
"""

from __future__ import annotations

import time
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from rich.console import Console
from rich.table import Table

from kcover.health.quarantine.kube import KubeQuarantine
from kcover.health.quarantine.policy import ANNOTATION_QUARANTINED, ANNOTATION_SINCE
from kcover.k8s.health_request import health_record
from kcover.k8s.kinds import BATCH_JOB, KINDS, JobKind
from kcover.k8s.names import OPT_IN_LABEL, OPT_IN_VALUE, RECOVERY, STATE, STRAGGLERS
from kcover.k8s.operator import stragglers
from kcover.k8s.operator.ettr import ettr_of
from kcover.k8s.operator.record import FailureSummary, RecoveryRecord
from kcover.k8s.operator.views import PodView, job_view, pod_view


def list_jobs(api: client.ApiClient, kind: JobKind, selector: str) -> list[dict[str, Any]]:
    """Jobs of ``kind`` in every namespace, as plain dicts; none when the kind is not installed or not visible."""
    try:
        if kind is BATCH_JOB:
            return [client.ApiClient().sanitize_for_serialization(j)
                    for j in client.BatchV1Api(api).list_job_for_all_namespaces(label_selector=selector).items]
        items = client.CustomObjectsApi(api).list_cluster_custom_object(
            kind.group, kind.version, kind.plural, label_selector=selector)["items"]
        return list(items)
    except ApiException as error:
        if error.status in (403, 404):
            return []  # kind not installed, or not visible to this user
        raise


def read_job(api: client.ApiClient, kind: JobKind, namespace: str, name: str) -> dict[str, Any] | None:
    """One job of ``kind`` as a plain dict; ``None`` when there is none (or the kind is not installed/visible)."""
    try:
        if kind is BATCH_JOB:
            found = client.BatchV1Api(api).read_namespaced_job(name, namespace)
            body: Any = client.ApiClient().sanitize_for_serialization(found)
        else:
            body = client.CustomObjectsApi(api).get_namespaced_custom_object(
                kind.group, kind.version, namespace, kind.plural, name)
    except ApiException as error:
        if error.status in (403, 404):
            return None
        raise
    return body if isinstance(body, dict) else None


def _jobs(api: client.ApiClient) -> list[dict[str, Any]]:
    selector = f"{OPT_IN_LABEL}={OPT_IN_VALUE}"
    found: list[dict[str, Any]] = []
    for kind in KINDS.values():
        for body in list_jobs(api, kind, selector):
            meta = body["metadata"]
            annotations = meta.get("annotations") or {}
            record = RecoveryRecord.from_annotation(annotations.get(RECOVERY))
            last = record.last or FailureSummary()
            ettr = ettr_of(job_view(kind.kind, body), record, _pods(api, kind, meta["namespace"], meta["name"]),
                           time.time())
            found.append({
                "kind": kind.kind, "namespace": meta["namespace"], "name": meta["name"],
                "state": annotations.get(STATE, "watching"), "restarts": record.restarts,
                "root_cause": last.category, "rule": last.rule, "nodes": list(last.nodes),
                "reason": last.decision or None,
                "ettr": round(ettr.ratio, 4) if ettr else None,
                "productive_seconds": round(ettr.productive, 1) if ettr else None,
                "wall_seconds": round(ettr.wall, 1) if ettr else None,
                "stragglers": stragglers.decode(annotations.get(STRAGGLERS)),
            })
    return found


def _pods(api: client.ApiClient, kind: JobKind, namespace: str, name: str) -> list[PodView]:
    """The job's pods (their progress is the live run's productive time); none when they cannot be listed."""
    try:
        listed = client.CoreV1Api(api).list_namespaced_pod(namespace, label_selector=kind.selector(name))
    except ApiException as error:
        if error.status in (403, 404):
            return []
        raise
    return [pod_view(api.sanitize_for_serialization(pod)) for pod in listed.items]


def collect_status(api: client.ApiClient) -> dict[str, Any]:
    nodes = KubeQuarantine(client.CoreV1Api(api)).nodes()
    quarantined = {n.name: {"reason": n.annotations.get(ANNOTATION_QUARANTINED),
                            "since": n.annotations.get(ANNOTATION_SINCE)} for n in nodes if n.quarantined_by_kcover}
    health = {n.name: record for n in nodes if (record := health_record(n.annotations)) is not None}
    return {"jobs": _jobs(api), "quarantined_nodes": quarantined, "node_health": health}


def print_status(report: dict[str, Any]) -> None:
    console = Console(highlight=False)
    table = Table(title="opted-in jobs", title_justify="left", box=None, header_style="bold")
    for column in ("kind", "namespace/name", "state", "restarts", "ETTR", "last root cause", "blamed nodes",
                   "stragglers"):
        table.add_column(column, overflow="fold")
    for job in report["jobs"]:
        cause = f"{job['root_cause']} ({job['rule']})" if job["root_cause"] else ""
        ettr = f"{job['ettr']:.2f}" if job.get("ettr") is not None else "-"
        slow = ", ".join(f"rank {s['rank']} on {s['node']} {s['slowdown']:.2f}x" for s in job.get("stragglers", []))
        table.add_row(job["kind"], f"{job['namespace']}/{job['name']}", job["state"], str(job["restarts"]), ettr,
                      cause, ", ".join(job["nodes"]), slow)
    console.print(table)
    nodes = report["quarantined_nodes"]
    if nodes:
        console.print("quarantined by kcover: " + ", ".join(f"{n} ({r.get('reason')})" for n, r in nodes.items()))
    else:
        console.print("no node quarantined by kcover")
    _print_health(console, report.get("node_health", {}), nodes)


def _print_health(console: Console, health: dict[str, dict[str, Any]], quarantined: dict[str, Any]) -> None:
    """One row per node the agents checked: the last run's time, status, and every check not passing."""
    if not health:
        return
    table = Table(title="node health (last run of the agent's checks)", title_justify="left", box=None,
                  header_style="bold")
    for column in ("node", "checked at", "status", "checks", "not passing"):
        table.add_column(column, overflow="fold")
    for node, record in sorted(health.items()):
        checks = [c for c in record.get("checks", []) if isinstance(c, dict)]
        bad = [f"{c.get('name')} {c.get('status')}: {c.get('reason')}" for c in checks
               if c.get("status") not in ("pass", "skipped")]
        status = str(record.get("status", "?")) + (" (quarantined)" if node in quarantined else "")
        table.add_row(node, str(record.get("at", "")), status, str(len(checks)), "; ".join(bad))
    console.print(table)
