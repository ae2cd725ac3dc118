"""The health-check vocabulary: statuses, one check's outcome and result, a node's report.

A *check* measures one thing about a node (a GPU's ECC count, the checkpoint
disk's fsync latency, the bus bandwidth of an all-reduce) and compares it with
a threshold from configuration.  It returns an :class:`Outcome`; the runner
(:mod:`kcover.health.runner`) adds the check's name and the seconds it took,
giving a :class:`CheckResult`.  All results of one run form a
:class:`HealthReport`, which ``kcover check --json`` prints, ``kcover
preflight`` gates on, and the node agent turns into a NodeCondition.

The status names are a public contract (``--json``, metrics), never renamed.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import StrEnum


class Status(StrEnum):
    """How one check came out.

    ``pass``/``warn``/``fail`` are verdicts about the node; ``skipped`` means the
    check does not apply here (no GPU, no InfiniBand device, no DCGM), with the
    reason; ``error`` means the check itself broke (it raised or its process
    died): a bug or a broken tool, not evidence against the node.  A check that
    overran its budget is ``fail`` (a node that hangs a check is not healthy).
    """

    PASS = "pass"
    WARN = "warn"
    FAIL = "fail"
    SKIPPED = "skipped"
    ERROR = "error"


_SEVERITY = {Status.SKIPPED: 0, Status.PASS: 1, Status.WARN: 2, Status.ERROR: 3, Status.FAIL: 4}


def worst(statuses: list[Status]) -> Status:
    """The most severe status (fail > error > warn > pass > skipped); ``pass`` for none."""
    return max(statuses, key=_SEVERITY.__getitem__, default=Status.PASS)


Value = float | int | str | None


@dataclass(frozen=True)
class Outcome:
    """What a check measured: status, value with its unit, the threshold applied and why."""

    status: Status
    reason: str
    value: Value = None
    unit: str = ""
    threshold: Value = None

    @classmethod
    def skipped(cls, reason: str) -> Outcome:
        return cls(Status.SKIPPED, reason)


@dataclass(frozen=True)
class CheckResult:
    """One check's outcome, named and timed: one entry of ``checks`` in ``--json``."""

    name: str
    status: Status
    reason: str
    value: Value = None
    unit: str = ""
    threshold: Value = None
    seconds: float = 0.0

    @classmethod
    def of(cls, name: str, outcome: Outcome, seconds: float) -> CheckResult:
        return cls(
            name=name,
            status=outcome.status,
            reason=outcome.reason,
            value=outcome.value,
            unit=outcome.unit,
            threshold=outcome.threshold,
            seconds=round(seconds, 3),
        )

    def to_dict(self) -> dict[str, object]:
        data = asdict(self)
        data["status"] = str(self.status)
        return {key: data[key] for key in ("name", "status", "value", "unit", "threshold", "reason", "seconds")}


@dataclass(frozen=True)
class HealthReport:
    """All results of one run on one node."""

    node: str
    checks: tuple[CheckResult, ...] = field(default=())

    @property
    def status(self) -> Status:
        return worst([result.status for result in self.checks])

    @property
    def failed(self) -> tuple[CheckResult, ...]:
        """The results that make the node unhealthy or the run unusable (fail and error)."""
        return tuple(r for r in self.checks if r.status in (Status.FAIL, Status.ERROR))

    @property
    def ok(self) -> bool:
        return not self.failed

    def to_dict(self) -> dict[str, object]:
        return {"node": self.node, "checks": [result.to_dict() for result in self.checks]}
