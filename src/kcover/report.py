"""Plain-data views of faults and verdicts, for ``--json`` output and the state database.

One function per type, so the JSON that users script against is defined in one
place (and documented in the README).  No I/O here.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from kcover.faults import Fault, Verdict


def fault_to_dict(fault: Fault) -> dict[str, Any]:
    return {
        "rule": fault.rule,
        "category": fault.category.value,
        "severity": fault.severity.value,
        "role": fault.role.value,
        "retriable": fault.retriable,
        "node_at_fault": fault.node_at_fault,
        "title": fault.title,
        "remediation": fault.remediation,
        "count": fault.count,
        "rank": fault.rank,
        "node": fault.node,
        "evidence": asdict(fault.evidence),
    }


def verdict_to_dict(verdict: Verdict) -> dict[str, Any]:
    return {
        "category": verdict.category.value if verdict.category else None,
        "rule": verdict.rule,
        "action": verdict.action.value,
        "retriable": verdict.retriable,
        "node_at_fault": verdict.node_at_fault,
        "nodes": list(verdict.nodes),
        "ranks": list(verdict.ranks),
        "reason": verdict.reason,
        "remediation": verdict.root.remediation if verdict.root else None,
    }
