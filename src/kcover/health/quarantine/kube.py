"""The Kubernetes actuator of the quarantine policy: patches to Node objects, nothing else.

Quarantine = ``spec.unschedulable`` + taint ``kcover.io/quarantine=<reason>:NoSchedule``
+ annotations ``kcover.io/quarantined`` (the reason), ``kcover.io/quarantined-at``
and ``kcover.io/health-passes``; release removes exactly those.  Spec and
metadata changes are JSON merge patches carrying the ``resourceVersion`` read,
so a concurrent writer makes the patch fail (409) and it is retried on a fresh
read instead of overwriting someone's taint.  The ``KcoverHealthy`` condition
is a strategic merge patch of ``status.conditions`` (merged by type, other
conditions untouched); ``lastTransitionTime`` changes only when the status does.

Takes a ``kubernetes.client.CoreV1Api`` (the ``k8s`` extra); the decision is
:func:`kcover.health.quarantine.policy.decide_node`.  Called by the node agent for
health results and by the operator for fault-driven quarantine.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from kcover.health.model import HealthReport
from kcover.health.quarantine.policy import (
    ANNOTATION_HEALTH,
    ANNOTATION_PASSES,
    ANNOTATION_QUARANTINED,
    ANNOTATION_SINCE,
    CONDITION_TYPE,
    TAINT_KEY,
    NodeAction,
    NodeDecision,
    NodeView,
    QuarantinePolicy,
    Taint,
    breaker_allows,
    decide_node,
)
from kcover.timestamps import rfc3339

CONFLICT = 409
_RETRIES = 5


def taint_value(reason: str) -> str:
    """A taint value is a label value: 63 characters of ``[A-Za-z0-9_.-]``, alphanumeric at both ends."""
    value = re.sub(r"[^A-Za-z0-9_.-]+", "_", reason)[:63].strip("_.-")
    return value or "unhealthy"


def node_view(node: Any) -> NodeView:
    """Our view of a Kubernetes Node (a client model or a plain dict)."""
    data = node if isinstance(node, dict) else node.to_dict()
    meta, spec = data.get("metadata") or {}, data.get("spec") or {}
    taints = tuple(Taint(t.get("key", ""), t.get("value") or "", t.get("effect", "")) for t in spec.get("taints") or [])
    return NodeView(
        name=meta.get("name", ""),
        unschedulable=bool(spec.get("unschedulable")),
        taints=taints,
        annotations=dict(meta.get("annotations") or {}),
    )


class KubeQuarantine:
    """Quarantine, release and condition updates on real Node objects."""

    def __init__(
        self,
        core: Any,
        policy: QuarantinePolicy | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.core = core
        self.policy = policy or QuarantinePolicy()
        self.clock = clock

    # --- reads -------------------------------------------------------------------------------

    def _read(self, name: str) -> tuple[NodeView, str, list[dict[str, Any]]]:
        node = self.core.read_node(name).to_dict()
        taints = list(node.get("spec", {}).get("taints") or [])
        return node_view(node), node["metadata"]["resource_version"], taints

    def nodes(self) -> list[NodeView]:
        return [node_view(item) for item in self.core.list_node().items]

    # --- writes ------------------------------------------------------------------------------

    def _patch(self, name: str, change: Callable[[NodeView, list[dict[str, Any]]], dict[str, Any] | None]) -> bool:
        """Read, compute a merge patch, send it with the resourceVersion read; retry on conflict."""
        from kubernetes.client.exceptions import ApiException

        for _ in range(_RETRIES):
            view, version, taints = self._read(name)
            body = change(view, taints)
            if body is None:
                return False
            body.setdefault("metadata", {})["resourceVersion"] = version
            try:
                self.core.patch_node(name, body, _content_type="application/merge-patch+json")
                return True
            except ApiException as exc:
                if exc.status != CONFLICT:
                    raise
        raise RuntimeError(f"node {name}: still conflicting after {_RETRIES} attempts")

    def quarantine(self, name: str, reason: str, *, force: bool = False) -> NodeDecision:
        """Cordon, taint and annotate ``name`` — refused for a node someone else cordoned, or by the breaker.

        ``force`` skips the circuit breaker (an operator's explicit request), never the foreign-cordon rule.
        """
        now = self.clock()
        if not force:
            allowed, why = breaker_allows(self.nodes(), now, self.policy)
            if not allowed:
                return NodeDecision(NodeAction.REFUSED_BREAKER, why)
        outcome: list[NodeDecision] = []

        def change(view: NodeView, taints: list[dict[str, Any]]) -> dict[str, Any] | None:
            if view.quarantined_by_kcover:
                outcome.append(NodeDecision(NodeAction.KEEP, "already quarantined by kcover"))
                return None
            if view.unschedulable:
                outcome.append(NodeDecision(NodeAction.REFUSED_FOREIGN_CORDON, "cordoned by someone else, untouched"))
                return None
            kept = [t for t in taints if t.get("key") != TAINT_KEY]
            ours = {"key": TAINT_KEY, "value": taint_value(reason.split(":", maxsplit=1)[0]), "effect": "NoSchedule"}
            return {
                "metadata": {
                    "annotations": {
                        ANNOTATION_QUARANTINED: reason[:1024],
                        ANNOTATION_SINCE: rfc3339(now),
                        ANNOTATION_PASSES: "0",
                    }
                },
                "spec": {"unschedulable": True, "taints": [*map(_api_taint, kept), ours]},
            }

        if self._patch(name, change):
            return NodeDecision(NodeAction.QUARANTINE, reason)
        return outcome[0]

    def release(self, name: str) -> NodeDecision:
        """Undo kcover's quarantine of ``name``; a node kcover did not quarantine is left alone."""
        outcome: list[NodeDecision] = []

        def change(view: NodeView, taints: list[dict[str, Any]]) -> dict[str, Any] | None:
            if not view.quarantined_by_kcover:
                outcome.append(NodeDecision(NodeAction.NONE, "not quarantined by kcover, untouched"))
                return None
            kept = [_api_taint(t) for t in taints if t.get("key") != TAINT_KEY]
            return {
                "metadata": {
                    "annotations": {ANNOTATION_QUARANTINED: None, ANNOTATION_SINCE: None, ANNOTATION_PASSES: None}
                },
                "spec": {"unschedulable": None, "taints": kept or None},
            }

        if self._patch(name, change):
            return NodeDecision(NodeAction.RELEASE, "released")
        return outcome[0]

    def _set_passes(self, name: str, passes: int) -> None:
        def change(view: NodeView, _: list[dict[str, Any]]) -> dict[str, Any] | None:
            if not view.quarantined_by_kcover:
                return None
            return {"metadata": {"annotations": {ANNOTATION_PASSES: str(passes)}}}

        self._patch(name, change)

    def set_condition(self, name: str, healthy: bool, reason: str, message: str) -> None:
        """Set ``KcoverHealthy`` (True/False) with a CamelCase reason and a message."""
        now = rfc3339(self.clock())
        status = "True" if healthy else "False"
        node = self.core.read_node_status(name).to_dict()
        previous = next(
            (c for c in node.get("status", {}).get("conditions") or [] if c["type"] == CONDITION_TYPE), None
        )
        transition = now
        if previous and previous.get("status") == status and previous.get("last_transition_time"):
            transition = rfc3339(previous["last_transition_time"])
        condition = {
            "type": CONDITION_TYPE,
            "status": status,
            "reason": reason,
            "message": message[:1024],
            "lastHeartbeatTime": now,
            "lastTransitionTime": transition,
        }
        self.core.patch_node_status(
            name, {"status": {"conditions": [condition]}}, _content_type="application/strategic-merge-patch+json"
        )

    def record_report(self, name: str, report: HealthReport, suite: str | None = None,
                      request: str | None = None) -> None:
        """Keep the run's every result on the node (annotation ``kcover.io/health``), for ``kcover status``
        and for ``kcover check --node`` (which waits for its ``request`` id there)."""
        checks = [{"name": r.name, "status": str(r.status), "value": r.value, "unit": r.unit,
                   "threshold": r.threshold, "reason": r.reason[:200], "seconds": round(r.seconds, 3)}
                  for r in report.checks]
        record: dict[str, Any] = {"at": rfc3339(self.clock()), "status": str(report.status), "checks": checks}
        if suite is not None:
            record["suite"] = suite
        if request is not None:
            record["request"] = request
        self.record(name, record)

    def record(self, name: str, record: dict[str, Any]) -> None:
        body = {"metadata": {"annotations": {ANNOTATION_HEALTH: json.dumps(record, separators=(",", ":"))}}}
        self.core.patch_node(name, body, _content_type="application/merge-patch+json")

    # --- the agent's entry point ---------------------------------------------------------------

    def observe(self, name: str, report: HealthReport, suite: str | None = None,
                request: str | None = None) -> NodeDecision:
        """Apply one health run of node ``name``: record, condition, then quarantine / count / release per policy."""
        self.record_report(name, report, suite, request)
        failed = report.failed
        problem = "; ".join(f"{r.name}: {r.reason}" for r in failed)
        self.set_condition(
            name,
            not failed,
            "ChecksFailed" if failed else "ChecksPassed",
            problem or f"{len(report.checks)} checks passed",
        )
        view, _, _ = self._read(name)
        needs_cluster = bool(failed) and not view.quarantined_by_kcover and not view.unschedulable
        decision = decide_node(
            view, not failed, problem, self.nodes() if needs_cluster else [view], self.clock(), self.policy
        )
        if decision.action is NodeAction.QUARANTINE:
            reason = failed[0].name if len(failed) == 1 else f"{failed[0].name}+{len(failed) - 1}"
            return self.quarantine(name, f"{reason}: {failed[0].reason}", force=True)
        if decision.action is NodeAction.RELEASE:
            self.release(name)
        elif decision.action is NodeAction.KEEP:
            self._set_passes(name, decision.passes)
        return decision


def _api_taint(taint: dict[str, Any]) -> dict[str, Any]:
    """A taint read through the client (snake_case, None fields) as the API wants it in a patch."""
    out = {"key": taint.get("key"), "effect": taint.get("effect")}
    if taint.get("value"):
        out["value"] = taint["value"]
    if taint.get("time_added"):
        added = taint["time_added"]
        out["timeAdded"] = rfc3339(added) if isinstance(added, datetime) else added
    return out
