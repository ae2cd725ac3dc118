"""What ``kcover pod`` tells the node agent: one line per change of its workers, in the container log.

``kcover pod`` runs the training processes inside a pod and restarts them in
place when the operator orders a new *generation* (see
:mod:`kcover.launcher.pod`).  It reports what happens through the one channel
that already exists and needs no permission: its container log, which the node
agent tails.  Each report is one line::

    kcover-pod: generation=2 state=running ranks=4-7 world=16 port=29501
    kcover-pod: generation=2 state=running step=1180 at=1796198400.25
    kcover-pod: generation=2 state=running checkpoint=1190 at=1796198412.5
    kcover-pod: generation=2 state=failed rank=5 exit=-9 step=1200
    kcover-pod: generation=2 state=stopped reason=order step=1200
    kcover-pod: generation=2 state=done
    kcover-pod: generation=0 state=running in-place=off reason=no order file /etc/kcover/generation

A ``running`` line is repeated, with ``at`` (epoch seconds), when the
generation's first step comes and when a newer checkpoint is complete: the
agent's record of the run's productive time (:mod:`kcover.k8s.progress`).
Each rank's compute seconds per step (the SDK's ``kcover.timed``, for the
straggler detector) come in batches of up to :data:`MAX_TIMINGS` steps::

    kcover-pod: generation=2 timing rank=5 from=1180 seconds=0.512,0.498,-,0.503

(``-``: no timing for that step).  The agent turns them into the pod's
``kcover.io/pod-state`` annotation (timings into ``kcover.io/step-times``) and
a failed rank's exit status into a fault; the operator reads both.  The words
avoid what the catalog matches (``exit code N``), so the agent's ordinary scan
does not count an exit twice.  This module is pure and sits low, so the
launcher side and the agent side share it without knowing each other.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

PREFIX = "kcover-pod: "
_FIELD = re.compile(r"(?<!\S)([a-z][a-z-]{0,39})=(\S+)")
"""A ``name=value`` field: a name starts a word, so a long run of letters is read once, never again from each of
its letters (``[a-z-]+=`` took 33 s on a 100 KB line with no ``=``)."""
_REASON = re.compile(r" reason=(.*)$")
MAX_GENERATION = 10**9


class PodState(StrEnum):
    """Where a pod's workers stand in their generation."""

    RUNNING = "running"
    FAILED = "failed"
    STOPPED = "stopped"
    DONE = "done"
    STANDBY = "standby"
    """No rank yet (``kcover pod --assigned-rank``): waiting, warm, for the operator to assign one."""


@dataclass(frozen=True)
class PodReport:
    """One ``kcover-pod:`` line, parsed."""

    generation: int
    state: PodState
    in_place: bool = True
    rank: int | None = None
    exit: int | None = None
    step: int | None = None
    checkpoint: int | None = None
    at: float | None = None
    """When ``step`` (a running generation's first) or ``checkpoint`` came, in epoch seconds."""
    reason: str = ""

    def line(self) -> str:
        """The line ``kcover pod`` prints (without the newline)."""
        parts = [f"generation={self.generation}", f"state={self.state.value}"]
        for key, value in (("rank", self.rank), ("exit", self.exit), ("step", self.step),
                           ("checkpoint", self.checkpoint)):
            if value is not None:
                parts.append(f"{key}={value}")
        if self.at is not None:
            parts.append(f"at={self.at:.3f}")
        if not self.in_place:
            parts.append("in-place=off")
        if self.reason:
            parts.append(f"reason={self.reason}")
        return PREFIX + " ".join(parts)


def _int(text: str | None, low: int, high: int) -> int | None:
    if text is None or not re.fullmatch(r"-?\d{1,12}", text):
        return None
    value = int(text)
    return value if low <= value <= high else None


def parse(text: str) -> PodReport | None:
    """The report in one log line (anything before the prefix is ignored); None when it is not one."""
    at = text.find(PREFIX)
    if at < 0:
        return None
    body = text[at + len(PREFIX):].rstrip("\r\n")
    reason_at = _REASON.search(body)
    reason = reason_at.group(1)[:300] if reason_at else ""
    fields = dict(_FIELD.findall(body[: reason_at.start()] if reason_at else body))
    generation = _int(fields.get("generation"), 0, MAX_GENERATION)
    try:
        state = PodState(fields.get("state", ""))
    except ValueError:
        return None
    if generation is None:
        return None
    return PodReport(generation, state, in_place=fields.get("in-place") != "off",
                     rank=_int(fields.get("rank"), 0, 10**6), exit=_int(fields.get("exit"), -255, 255),
                     step=_int(fields.get("step"), 0, 10**15), checkpoint=_int(fields.get("checkpoint"), 0, 10**15),
                     at=_moment(fields.get("at")), reason=reason)


def _moment(text: str | None) -> float | None:
    if text is None or not re.fullmatch(r"\d{1,10}(\.\d{1,6})?", text):
        return None
    return float(text)


MAX_TIMINGS = 32
"""Steps per timing line; ``kcover pod`` sends a rank's batch once it is full (or older than a few seconds)."""
_TIMING = re.compile(r"generation=(\d{1,10}) timing rank=(\d{1,7}) from=(\d{1,15}) seconds=([0-9eE.,+-]{1,600})$")


@dataclass(frozen=True)
class PodTimings:
    """One rank's compute seconds of consecutive steps from ``first`` (None: not timed)."""

    generation: int
    rank: int
    first: int
    seconds: tuple[float | None, ...]

    def line(self) -> str:
        values = ",".join("-" if s is None else f"{s:.6g}" for s in self.seconds)
        return f"{PREFIX}generation={self.generation} timing rank={self.rank} from={self.first} seconds={values}"

    def steps(self) -> list[tuple[int, float]]:
        """(step, seconds) of each timed step."""
        return [(self.first + i, s) for i, s in enumerate(self.seconds) if s is not None]


def parse_timings(text: str) -> PodTimings | None:
    """The timings in one log line; None when it is not a timing line (or a value is not a positive finite
    number of seconds: the whole line is then refused)."""
    at = text.find(PREFIX)
    if at < 0:
        return None
    found = _TIMING.fullmatch(text[at + len(PREFIX):].rstrip("\r\n"))
    if found is None:
        return None
    generation, rank, first = (int(found.group(i)) for i in (1, 2, 3))
    values: list[float | None] = []
    for word in found.group(4).split(","):
        if word == "-":
            values.append(None)
            continue
        try:
            seconds = float(word)
        except ValueError:
            return None
        if not 0 < seconds < 1e6:  # nan compares false
            return None
        values.append(seconds)
    if len(values) > MAX_TIMINGS or generation > MAX_GENERATION:
        return None
    return PodTimings(generation, rank, first, tuple(values))
