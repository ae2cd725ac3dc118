"""What ``kcover pod`` tells the node agent: one line per change of its workers, in the container log.

``kcover pod`` runs the training processes inside a pod and restarts them in
place when the operator orders a new *generation* (see
:mod:`kcover.launcher.pod`).  It reports what happens through the one channel
that already exists and needs no permission: its container log, which the node
agent tails.  Each report is one line::

    kcover-pod: generation=2 state=running ranks=4-7 world=16 port=29501
    kcover-pod: generation=2 state=failed rank=5 exit=-9 step=1200
    kcover-pod: generation=2 state=stopped reason=order step=1200
    kcover-pod: generation=2 state=done
    kcover-pod: generation=0 state=running in-place=off reason=no order file /etc/kcover/generation

The agent turns them into the pod's ``kcover.io/pod-state`` annotation and a
failed rank's exit status into a fault; the operator reads both.  The words
avoid what the catalog matches (``exit code N``), so the agent's ordinary scan
does not count an exit twice.  This module is pure and sits low, so the
launcher side and the agent side share it without knowing each other.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

PREFIX = "kcover-pod: "
_FIELD = re.compile(r"([a-z-]+)=(\S+)")
_REASON = re.compile(r" reason=(.*)$")
MAX_GENERATION = 10**9


class PodState(StrEnum):
    """Where a pod's workers stand in their generation."""

    RUNNING = "running"
    FAILED = "failed"
    STOPPED = "stopped"
    DONE = "done"


@dataclass(frozen=True)
class PodReport:
    """One ``kcover-pod:`` line, parsed."""

    generation: int
    state: PodState
    in_place: bool = True
    rank: int | None = None
    exit: int | None = None
    step: int | None = None
    reason: str = ""

    def line(self) -> str:
        """The line ``kcover pod`` prints (without the newline)."""
        parts = [f"generation={self.generation}", f"state={self.state.value}"]
        for key, value in (("rank", self.rank), ("exit", self.exit), ("step", self.step)):
            if value is not None:
                parts.append(f"{key}={value}")
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
                     step=_int(fields.get("step"), 0, 10**15), reason=reason)

