"""Fault records as they travel through the API server: compact JSON in a pod annotation.

The node agent classifies log lines where they are written and records each
distinct fault on the pod (``kcover.io/faults``), at most :data:`MAX_RECORDS`
of them, each with its repeat count; the operator reads them back as
:class:`~kcover.faults.Fault` objects.  No log shipping: only the verdict-relevant
lines cross the network.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from kcover.faults import Category, Evidence, Fault, Role, Severity
from kcover.report import fault_to_dict

MAX_RECORDS = 20
MAX_LINE = 500


def fault_record(fault: Fault) -> dict[str, Any]:
    """The compact record of a fault: :func:`~kcover.report.fault_to_dict` with its evidence flattened.

    Without the remediation (the operator takes it from its own catalog), with
    the priority (the operator ranks root causes by it), the line cut to
    :data:`MAX_LINE` characters.
    """
    document = fault_to_dict(fault)
    del document["remediation"]
    evidence = document.pop("evidence")
    return {**document, "priority": fault.priority, **evidence, "line": evidence["line"][:MAX_LINE]}


def encode(faults: Sequence[Fault]) -> str:
    return json.dumps([fault_record(f) for f in faults[:MAX_RECORDS]], separators=(",", ":"))


def decode(text: str | None, remediation: dict[str, str] | None = None) -> list[Fault]:
    """Faults from an annotation; unreadable records are skipped, never fatal."""
    if not text:
        return []
    try:
        records = json.loads(text)
    except json.JSONDecodeError:
        return []
    faults = []
    for record in records if isinstance(records, list) else []:
        try:
            evidence = Evidence(source=str(record["source"]), line=str(record["line"]),
                                line_number=record.get("line_number"), timestamp=record.get("timestamp"),
                                rank=record.get("rank"), node=record.get("node"), step=_step(record.get("step")))
            faults.append(Fault(
                rule=str(record["rule"]), category=Category(record["category"]),
                severity=Severity(record["severity"]), retriable=bool(record["retriable"]),
                node_at_fault=bool(record["node_at_fault"]), role=Role(record["role"]),
                priority=int(record["priority"]), title=str(record["title"]),
                remediation=(remediation or {}).get(str(record["rule"]), ""), evidence=evidence,
                count=int(record.get("count", 1)),
            ))
        except (KeyError, ValueError, TypeError):
            continue
    return faults


def _step(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
