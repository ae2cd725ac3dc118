"""Fault records as they travel through the API server: compact JSON in a pod annotation.

The node agent classifies log lines where they are written and records each
distinct fault on the pod (``kcover.io/faults``), at most :data:`MAX_RECORDS`
of them, each with its repeat count; the operator reads them back as
:class:`~kcover.faults.Fault` objects.  No log shipping: only the verdict-relevant
lines cross the network.

When the pod runs ``kcover pod``, each record also carries the ``generation``
of the pod's workers it was seen in, and the pod carries
``kcover.io/pod-state`` (:class:`PodStatus`): the generation its workers run,
their state, whether they restart in place, and the newest step reported.
The operator reads a pod's faults of its current generation only
(:func:`decode` with ``generation``): an in-place restart leaves the pod, and
its earlier records, in place.  ``kcover.io/step-times`` (:class:`StepTimes`)
carries the newest compute seconds per step of each of the pod's ranks, for
the operator's straggler detector.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kcover.faults import Category, Evidence, Fault, Role, Severity
from kcover.podline import MAX_GENERATION, PodState
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


def decode(text: str | None, remediation: dict[str, str] | None = None, generation: int | None = None) -> list[Fault]:
    """Faults from an annotation (with ``generation``: those seen in it, or with none recorded); unreadable
    records are skipped, never fatal."""
    if not text:
        return []
    try:
        records = json.loads(text)
    except ValueError:  # not JSON, or a number beyond Python's 4,300-digit limit for int()
        return []
    faults = []
    for record in records if isinstance(records, list) else []:
        if generation is not None and isinstance(record, dict) and _step(record.get("generation")) not in (
                None, generation):
            continue
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


MAX_STEP = 10**15


def _whole(value: object) -> int | None:
    """A step or generation: a whole number from 0 to :data:`MAX_STEP` (a step of 10**100 would make every real
    one look old)."""
    step = _step(value)
    return step if step is not None and 0 <= step <= MAX_STEP else None


@dataclass(frozen=True)
class PodStatus:
    """``kcover.io/pod-state``: where a ``kcover pod``'s workers stand, as the agent last read it."""

    generation: int
    state: PodState
    in_place: bool = True
    step: int | None = None

    def encode(self) -> str:
        return json.dumps({"generation": self.generation, "state": self.state.value, "in_place": self.in_place,
                           "step": self.step}, separators=(",", ":"))

    @classmethod
    def decode(cls, text: str | None) -> PodStatus | None:
        """The status in an annotation; None when absent or unreadable (the pod then counts as without kcover)."""
        if not text:
            return None
        try:
            raw = json.loads(text)
            generation = _step(raw["generation"])
            state = PodState(raw["state"])
        except (ValueError, KeyError, TypeError):
            return None
        if generation is None or not 0 <= generation <= MAX_GENERATION:
            return None
        return cls(generation, state, raw.get("in_place") is not False, _step(raw.get("step")))


MAX_TIMED_STEPS = 32
"""Newest steps per rank kept in ``kcover.io/step-times`` (the operator reads it at least every few seconds)."""
MAX_TIMED_RANKS = 64
"""Ranks per pod kept (8 GPUs per pod is usual; the annotation stays a few kilobytes)."""


@dataclass(frozen=True)
class StepTimes:
    """``kcover.io/step-times``: each rank's compute seconds of its newest steps, in one generation."""

    generation: int
    ranks: Mapping[int, Mapping[int, float]]
    """rank → step → seconds."""

    def encode(self) -> str:
        ranks = {str(rank): [[step, round(seconds, 6)] for step, seconds in sorted(steps.items())]
                 for rank, steps in sorted(self.ranks.items())}
        return json.dumps({"generation": self.generation, "ranks": ranks}, separators=(",", ":"))

    @classmethod
    def decode(cls, text: str | None) -> StepTimes | None:
        """The times in an annotation; None when absent or unreadable; bad entries are skipped."""
        if not text or len(text) > 200_000:
            return None
        try:
            raw = json.loads(text)
            generation = _whole(raw["generation"])
            ranks = raw["ranks"]
        except (ValueError, KeyError, TypeError, RecursionError):
            return None
        if generation is None or generation > MAX_GENERATION or not isinstance(ranks, dict):
            return None
        found: dict[int, dict[int, float]] = {}
        for rank_text, pairs in list(ranks.items())[:MAX_TIMED_RANKS]:
            if not (isinstance(rank_text, str) and rank_text.isdigit() and len(rank_text) <= 7
                    and isinstance(pairs, list)):
                continue
            steps = {}
            for pair in pairs[-MAX_TIMED_STEPS:]:
                if (isinstance(pair, list) and len(pair) == 2 and _whole(pair[0]) is not None
                        and isinstance(pair[1], int | float) and not isinstance(pair[1], bool)
                        and 0 < pair[1] < 1e6):
                    steps[pair[0]] = float(pair[1])
            if steps:
                found[int(rank_text)] = steps
        return cls(generation, found)
