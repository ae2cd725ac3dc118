"""The recovery record: what kcover keeps on a job, typed, with one reader and one writer.

The operator's state for a job lives in the job's ``kcover.io/recovery``
annotation, so that any replica (and ``kcover status``) reads the same thing
and a restart half done by a replica that died can be finished by the next.
:class:`RecoveryRecord` is the only code that reads or writes that annotation:
:meth:`RecoveryRecord.from_annotation` parses it (anything unreadable becomes
the empty record, never an exception) and :meth:`RecoveryRecord.to_annotation`
writes it.  Everything else works on typed fields: phases and methods are
enums, times are timezone-aware datetimes, and the transitions of the restart
saga (:meth:`claimed`, :meth:`suspended`, :meth:`completed`, :meth:`failed`)
are methods that return a new record.

The JSON keys are those earlier versions wrote, so a record written by an
older operator is read correctly (``exclude``, the nodes to quarantine for the
current restart, is now written as ``quarantine``).
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, TypeVar

from kcover.decide.policy import PastFailure, RecoveryState
from kcover.faults import Category, Verdict
from kcover.timestamps import parse_rfc3339, rfc3339

_E = TypeVar("_E", bound=StrEnum)
MAX_FAILURES = 20
"""Past failures kept on the record (the policy looks at recent ones only)."""


class RecoveryPhase(StrEnum):
    """Where a job stands: watched while it runs, in the middle of a restart, or given up on."""

    RUNNING = "running"
    RESTARTING = "restarting"
    FAILED = "failed"


class RestartStep(StrEnum):
    """How far a claimed restart has gone (only suspend-based restarts have a second step)."""

    CLAIMED = "claimed"
    SUSPENDED = "suspended"
    ORDERED = "ordered"
    """An in-place restart whose new generation has been written on the pods."""


class RestartMethod(StrEnum):
    """How the pods are stopped and started again (see :mod:`kcover.k8s.operator.actuate`)."""

    NATIVE = "native"
    RECREATE = "recreate"
    RENEW_CHILDREN = "renew-children"
    IN_PLACE = "in-place"
    """The pods stay; ``kcover pod`` in each restarts its workers for a new generation."""
    STANDBY = "standby"
    """A blamed node's pods go, warm standby pods take their ranks, and every other pod restarts in place."""


@dataclass(frozen=True)
class FailureSummary:
    """The failure that decided the last restart or fail-fast, as ``kcover status`` and people read it."""

    category: str | None = None
    rule: str | None = None
    action: str | None = None
    retriable: bool | None = None
    node_at_fault: bool | None = None
    nodes: tuple[str, ...] = ()
    ranks: tuple[int, ...] = ()
    reason: str = ""
    remediation: str | None = None
    decision: str = ""

    @classmethod
    def of(cls, verdict: Verdict, decision: str) -> FailureSummary:
        return cls(
            category=verdict.category.value if verdict.category else None, rule=verdict.rule,
            action=verdict.action.value, retriable=verdict.retriable, node_at_fault=verdict.node_at_fault,
            nodes=tuple(verdict.nodes), ranks=tuple(verdict.ranks), reason=verdict.reason,
            remediation=verdict.root.remediation if verdict.root else None, decision=decision,
        )

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> FailureSummary:
        return cls(
            category=_optional_str(raw.get("category")), rule=_optional_str(raw.get("rule")),
            action=_optional_str(raw.get("action")), retriable=_optional_bool(raw.get("retriable")),
            node_at_fault=_optional_bool(raw.get("node_at_fault")), nodes=_strings(raw.get("nodes")),
            ranks=tuple(r for r in _list(raw.get("ranks")) if isinstance(r, int) and not isinstance(r, bool)),
            reason=str(raw.get("reason") or ""), remediation=_optional_str(raw.get("remediation")),
            decision=str(raw.get("decision") or ""),
        )

    def to_dict(self) -> dict[str, Any]:
        return {"category": self.category, "rule": self.rule, "action": self.action, "retriable": self.retriable,
                "node_at_fault": self.node_at_fault, "nodes": list(self.nodes), "ranks": list(self.ranks),
                "reason": self.reason, "remediation": self.remediation, "decision": self.decision}


@dataclass(frozen=True)
class RecoveryRecord:
    """A job's recovery state (see the module docstring); the empty record is a job kcover never acted on."""

    attempt: int = 1
    phase: RecoveryPhase = RecoveryPhase.RUNNING
    step: RestartStep = RestartStep.CLAIMED
    restarts: int = 0
    streak: int | None = None
    """Restarts since the last healthy run (None in records of older operators: counted as ``restarts``)."""
    failures: tuple[PastFailure, ...] = ()
    excluded: tuple[str, ...] = ()
    restarted_at: dt.datetime | None = None
    not_before: dt.datetime | None = None
    replaced: tuple[str, ...] = ()
    failing: tuple[str, ...] = ()
    quarantine: tuple[str, ...] = ()
    method: RestartMethod = RestartMethod.NATIVE
    why: str = ""
    """Why the restart uses its method (in place, or why not)."""
    generation: int = 0
    """The newest generation ordered in place (0: never)."""
    in_place_pods: tuple[str, ...] = ()
    """The uids of the pods an in-place restart orders (each must reach the new generation)."""
    in_place_step: int | None = None
    """The step the last in-place restart's failure came at: a failure that gets no further restarts the pods."""
    takeover: tuple[tuple[str, int], ...] = ()
    """A standby restart's (standby pod uid, rank it takes over); the pods it deletes are in ``replaced``."""
    ordered_at: dt.datetime | None = None
    productive: float = 0.0
    """Productive seconds of the job's runs that ended in a restart (:mod:`kcover.k8s.progress`)."""
    began: dt.datetime | None = None
    """When the job was first created (a batch Job replaced by a restart is created again: its own creation
    time is later)."""
    ended: dt.datetime | None = None
    """When kcover gave the job up (phase ``failed``): its ETTR stops there."""
    last: FailureSummary | None = None
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False)
    """Keys this version does not know (written by a newer operator): kept as they were."""

    # -- reading and writing the annotation ------------------------------------------------------
    @classmethod
    def from_annotation(cls, text: str | None) -> RecoveryRecord:
        """The record in an annotation's text; the empty record when it is missing or unreadable."""
        try:
            raw = json.loads(text) if text else {}
        except (ValueError, RecursionError):  # not JSON, or a number of more than 4,300 digits
            return cls()
        return cls.from_dict(raw) if isinstance(raw, dict) else cls()

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> RecoveryRecord:
        last = raw.get("last")
        return cls(
            attempt=_int(raw.get("attempt"), 1), phase=_enum(RecoveryPhase, raw.get("phase"), RecoveryPhase.RUNNING),
            step=_enum(RestartStep, raw.get("step"), RestartStep.CLAIMED), restarts=_int(raw.get("restarts"), 0),
            streak=_optional_int(raw.get("streak")),
            failures=tuple(_past_failure(f) for f in _list(raw.get("failures")) if isinstance(f, dict)),
            excluded=_strings(raw.get("excluded")), restarted_at=parse_rfc3339(raw.get("restarted_at")),
            not_before=parse_rfc3339(raw.get("not_before")), replaced=_strings(raw.get("replaced")),
            failing=_strings(raw.get("failing")), quarantine=_strings(raw.get("quarantine", raw.get("exclude"))),
            method=_enum(RestartMethod, raw.get("method"), RestartMethod.NATIVE), why=str(raw.get("why") or "")[:500],
            generation=_int(raw.get("generation"), 0), in_place_pods=_strings(raw.get("in_place_pods")),
            in_place_step=_optional_int(raw.get("in_place_step")), takeover=_takeover(raw.get("takeover")),
            ordered_at=parse_rfc3339(raw.get("ordered_at")),
            productive=_seconds(raw.get("productive")), began=parse_rfc3339(raw.get("began")),
            ended=parse_rfc3339(raw.get("ended")),
            last=FailureSummary.from_dict(last) if isinstance(last, dict) else None,
            extra={k: v for k, v in raw.items() if k not in _KNOWN},
        )

    def to_dict(self) -> dict[str, Any]:
        written: dict[str, Any] = {
            **self.extra, "attempt": self.attempt, "phase": self.phase.value, "restarts": self.restarts,
            "failures": [{"category": f.category.value if f.category else None, "rule": f.rule,
                          "hung_at_step": f.hung_at_step} for f in self.failures[-MAX_FAILURES:]],
            "excluded": list(self.excluded), "replaced": list(self.replaced), "failing": list(self.failing),
            "quarantine": list(self.quarantine), "method": self.method.value,
        }
        if self.streak is not None:
            written["streak"] = self.streak
        if self.why:
            written["why"] = self.why
        if self.generation:
            written |= {"generation": self.generation, "in_place_pods": list(self.in_place_pods)}
        if self.in_place_step is not None:
            written["in_place_step"] = self.in_place_step
        if self.takeover:
            written["takeover"] = [[uid, rank] for uid, rank in self.takeover]
        if self.step is not RestartStep.CLAIMED:
            written["step"] = self.step.value
        if self.productive:
            written["productive"] = round(self.productive, 3)
        for key, moment in (("restarted_at", self.restarted_at), ("not_before", self.not_before),
                            ("ordered_at", self.ordered_at), ("began", self.began), ("ended", self.ended)):
            if moment is not None:
                written[key] = rfc3339(moment, "milliseconds")
        if self.last is not None:
            written["last"] = self.last.to_dict()
        return written

    def to_annotation(self) -> str:
        return json.dumps(self.to_dict())

    # -- the policy's view -----------------------------------------------------------------------
    @property
    def state(self) -> RecoveryState:
        """What the shared decision core needs: restarts so far, past failures, excluded nodes."""
        return RecoveryState(restarts=self.restarts, failures=self.failures, excluded=self.excluded,
                             streak=self.restarts if self.streak is None else self.streak)

    def due(self, now: dt.datetime) -> bool:
        """Whether a claimed restart's backoff is over."""
        return self.not_before is None or self.not_before <= now

    # -- the restart saga's transitions ----------------------------------------------------------
    def claimed(self, state: RecoveryState, verdict: Verdict, decision: str, now: dt.datetime, delay: float,
                replaced: Sequence[str], failing: Sequence[str], quarantine: Sequence[str],
                method: RestartMethod, why: str = "", in_place: InPlaceOrder | None = None,
                run: float = 0.0, began: dt.datetime | None = None) -> RecoveryRecord:
        """Step 1 of a restart: everything the later steps need, so any replica can replay them.

        The run that failed ends here: its productive seconds (``run``) are added to the job's, and the job's
        creation (``began``) is kept the first time.

        An in-place restart (``in_place``) replaces no pod: it records the generation to order, the pods
        that must reach it and the step the failure came at; a restart of pods forgets that step.  A standby
        restart replaces only the blamed node's pods, and records which standby takes which rank.
        """
        base = replace(
            self._with_state(state), attempt=self.attempt + 1, phase=RecoveryPhase.RESTARTING,
            step=RestartStep.CLAIMED, restarted_at=now, not_before=now + dt.timedelta(seconds=delay),
            replaced=tuple(replaced), failing=tuple(failing), quarantine=tuple(quarantine), method=method, why=why,
            ordered_at=None, last=FailureSummary.of(verdict, decision),
            productive=self.productive + _seconds(run), began=self.began or began,
        )
        if in_place is None:
            return replace(base, in_place_pods=(), in_place_step=None, takeover=())
        return replace(base, replaced=in_place.dropped, generation=in_place.generation, in_place_pods=in_place.pods,
                       in_place_step=in_place.step, takeover=in_place.takeover)

    def ordered(self, now: dt.datetime) -> RecoveryRecord:
        """An in-place restart's generation is written on its pods."""
        return replace(self, step=RestartStep.ORDERED, ordered_at=now)

    def escalated(self, replaced: Sequence[str], method: RestartMethod, why: str, now: dt.datetime) -> RecoveryRecord:
        """An in-place restart that could not finish becomes a restart of the pods (same attempt, no backoff)."""
        return replace(self, step=RestartStep.CLAIMED, method=method, why=why, replaced=tuple(replaced),
                       not_before=now, in_place_pods=(), in_place_step=None, takeover=())

    def suspended(self) -> RecoveryRecord:
        return replace(self, step=RestartStep.SUSPENDED)

    def completed(self) -> RecoveryRecord:
        """The record of a finished restart (the saga's last step)."""
        return replace(self, phase=RecoveryPhase.RUNNING, step=RestartStep.CLAIMED)

    def failed(self, state: RecoveryState, verdict: Verdict, decision: str, now: dt.datetime | None = None,
               run: float = 0.0, began: dt.datetime | None = None) -> RecoveryRecord:
        """kcover gives the job up at ``now``: the run that failed is closed as a restart closes it."""
        return replace(self._with_state(state), phase=RecoveryPhase.FAILED, last=FailureSummary.of(verdict, decision),
                       ended=now, productive=self.productive + _seconds(run), began=self.began or began)

    def _with_state(self, state: RecoveryState) -> RecoveryRecord:
        return replace(self, restarts=state.restarts, failures=tuple(state.failures)[-MAX_FAILURES:],
                       excluded=tuple(state.excluded), streak=state.streak)


_KNOWN = frozenset({"attempt", "phase", "step", "restarts", "streak", "failures", "excluded", "restarted_at",
                    "not_before", "replaced", "failing", "quarantine", "exclude", "method", "last", "why", "generation",
                    "in_place_pods", "in_place_step", "takeover", "ordered_at", "productive", "began", "ended"})


@dataclass(frozen=True)
class InPlaceOrder:
    """What an in-place restart orders: the new generation, the pods that must reach it, the failure's step; for a
    standby restart also the pods it deletes and which standby pod takes which rank."""

    generation: int
    pods: tuple[str, ...]
    step: int | None = None
    dropped: tuple[str, ...] = ()
    takeover: tuple[tuple[str, int], ...] = ()


def _past_failure(raw: Mapping[str, Any]) -> PastFailure:
    category = raw.get("category")
    try:
        parsed = Category(category) if category else None
    except ValueError:
        parsed = Category.OTHER
    step = raw.get("hung_at_step")
    return PastFailure(parsed, _optional_str(raw.get("rule")),
                       step if isinstance(step, int) and not isinstance(step, bool) else None)


def _takeover(value: object) -> tuple[tuple[str, int], ...]:
    return tuple((pair[0], pair[1]) for pair in _list(value)
                 if isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], str)
                 and isinstance(pair[1], int) and not isinstance(pair[1], bool) and 0 <= pair[1] < 10**7)


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _strings(value: object) -> tuple[str, ...]:
    return tuple(str(v) for v in _list(value) if isinstance(v, str))


def _optional_str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _optional_int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _seconds(value: object) -> float:
    """A non-negative finite number of seconds; anything else is 0."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not -1e10 <= value <= 1e10:
        return 0.0  # compared before float(): a 400-digit integer would overflow it
    seconds = float(value)
    return seconds if seconds >= 0 else 0.0


def _optional_bool(value: object) -> bool | None:
    return value if isinstance(value, bool) else None


def _int(value: object, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else default


def _enum(kind: type[_E], value: object, default: _E) -> _E:
    try:
        return kind(value) if isinstance(value, str) else default
    except ValueError:
        return default
