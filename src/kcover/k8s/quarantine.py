"""Taking a node out of service, and giving it back — only the nodes kcover took.

Quarantine = cordon (``spec.unschedulable``) + taint
``kcover.io/quarantine=<reason>:NoSchedule`` + the annotation
``kcover.io/quarantined`` recording why and when.  Release undoes exactly that,
and only on nodes carrying kcover's annotation: a node someone else cordoned is
never touched.  A circuit breaker refuses to quarantine more than
``max_share`` of the cluster's nodes (counting those already quarantined) and
says so instead; one bad rule or a fabric-wide incident must not drain a
cluster.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from kubernetes import client

from kcover.k8s.names import QUARANTINE_TAINT, QUARANTINED
from kcover.k8s.operator.views import utc_now


@dataclass(frozen=True)
class QuarantineResult:
    node: str
    done: bool
    reason: str


def breaker_allows(total_nodes: int, already: int, max_share: float) -> bool:
    """True while quarantining one more node keeps the quarantined share within ``max_share``."""
    allowed = max(1, math.floor(total_nodes * max_share))
    return already + 1 <= allowed


class Quarantine:
    def __init__(self, api: client.ApiClient, max_share: float = 0.1) -> None:
        self.core = client.CoreV1Api(api)
        self.max_share = max_share

    def quarantined(self) -> dict[str, dict[str, Any]]:
        """Nodes kcover quarantined, with the record it left on each."""
        found = {}
        for node in self.core.list_node().items:
            record = (node.metadata.annotations or {}).get(QUARANTINED)
            if record:
                try:
                    found[node.metadata.name] = json.loads(record)
                except ValueError:
                    found[node.metadata.name] = {"reason": record}
        return found

    def quarantine(self, node: str, reason: str, detail: str = "") -> QuarantineResult:
        nodes = self.core.list_node().items
        mine = self.quarantined()
        if node in mine:
            return QuarantineResult(node, True, "already quarantined by kcover")
        if not breaker_allows(len(nodes), len(mine), self.max_share):
            return QuarantineResult(node, False, f"circuit breaker: {len(mine)} of {len(nodes)} nodes already "
                                                 f"quarantined (max share {self.max_share:.0%})")
        body = self.core.read_node(node)
        taints = [t for t in (body.spec.taints or []) if t.key != QUARANTINE_TAINT]
        taints.append(client.V1Taint(key=QUARANTINE_TAINT, value=_label_value(reason), effect="NoSchedule"))
        record = json.dumps({"reason": reason, "detail": detail[:300], "at": utc_now(),
                             "was_unschedulable": bool(body.spec.unschedulable)})
        self.core.patch_node(node, {"metadata": {"annotations": {QUARANTINED: record}},
                                    "spec": {"unschedulable": True, "taints": [_taint_dict(t) for t in taints]}})
        return QuarantineResult(node, True, "quarantined")

    def release(self, node: str) -> bool:
        """Undo kcover's quarantine; False (and nothing touched) if kcover did not quarantine it."""
        body = self.core.read_node(node)
        record = (body.metadata.annotations or {}).get(QUARANTINED)
        if not record:
            return False
        try:
            was_unschedulable = bool(json.loads(record).get("was_unschedulable"))
        except ValueError:
            was_unschedulable = False
        taints = [_taint_dict(t) for t in (body.spec.taints or []) if t.key != QUARANTINE_TAINT]
        self.core.patch_node(node, {"metadata": {"annotations": {QUARANTINED: None}},
                                    "spec": {"unschedulable": was_unschedulable or None, "taints": taints}})
        return True


def _taint_dict(taint: Any) -> dict[str, Any]:
    return {"key": taint.key, "value": taint.value, "effect": taint.effect}


def _label_value(text: str) -> str:
    cleaned = "".join(ch if ch.isalnum() or ch in "-_." else "-" for ch in text)[:63]
    return cleaned.strip("-_.") or "fault"
