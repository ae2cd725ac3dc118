"""Where a run's time went: each attempt split into productive and lost segments.

The same accounting as ``kcover run``'s ETTR (:mod:`kcover.launcher.reporting`):
an attempt is productive from its first step to its last complete checkpoint (to
its end when it succeeds).  The rest is lost, and named by what it was spent on:
``startup`` (first attempt) or ``restart`` (later ones) before the first step,
``redone`` work after the last checkpoint that the next attempt does again,
``detection`` from the fault (for a hang: the last step) to the stop,
``shutdown`` while the workers are stopped, ``backoff`` before the next attempt,
and ``other`` for what the history cannot place.  Pure: no I/O, no clock.

Moments that are missing, out of order, before the attempt or after its end
(a clock step, a damaged row) are clamped into order, so no segment is ever
negative and the segments of an attempt tile it exactly.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from kcover.runreport.model import AttemptRow, RunData

KINDS = ("productive", "startup", "restart", "redone", "detection", "shutdown", "backoff", "other")
"""Segment kinds, in the order the page lists them."""
LOST = KINDS[1:]


@dataclass(frozen=True)
class Segment:
    kind: str
    start: float
    end: float
    attempt: int

    @property
    def seconds(self) -> float:
        return self.end - self.start


def attempt_segments(attempt: AttemptRow, end: float | None = None) -> list[Segment]:
    """The attempt from its start to ``end`` (its recorded end by default) as consecutive segments."""
    start = attempt.started
    finish = max(start, end if end is not None else (attempt.ended or _last_moment(attempt)))
    m = attempt.moments
    if all(v is None for v in m.values()):
        return [Segment("other", start, finish, attempt.number)]
    cuts = _cuts(attempt, start, finish)
    segments = [Segment(kind, a, b, attempt.number) for kind, a, b in cuts if b > a]
    return segments or [Segment("other", start, finish, attempt.number)]


def _cuts(attempt: AttemptRow, start: float, finish: float) -> list[tuple[str, float, float]]:
    m = attempt.moments
    first_step = m.get("first_progress")
    stop_began = m.get("stop_began") or m.get("stopped") or finish
    stopped = m.get("stopped") or finish
    succeeded = attempt.outcome == "succeeded"
    if first_step is None:
        work_end = fault_at = first_step = _clamp(stop_began, start, finish)
    elif succeeded:
        work_end = fault_at = stopped
    else:
        work_end = m.get("last_checkpoint") or first_step
        fault_at = _fault_moment(attempt, stop_began)
    points = _ordered([start, first_step, work_end, fault_at, stop_began, stopped, finish], start, finish)
    opening = "startup" if attempt.number <= 1 else "restart"
    kinds = (opening, "productive", "redone", "detection", "shutdown", "backoff")
    return [(kind, points[i], points[i + 1]) for i, kind in enumerate(kinds)]


def _fault_moment(attempt: AttemptRow, stop_began: float) -> float:
    """When the attempt stopped doing useful work: its last step for a hang, else its first fault."""
    if attempt.outcome == "hung" and attempt.steps:
        return attempt.steps[-1][0]
    return attempt.moments.get("first_fault") or stop_began


def _ordered(points: list[float], low: float, high: float) -> list[float]:
    """``points`` clamped into ``[low, high]`` and made non-decreasing."""
    ordered, floor = [], low
    for point in points:
        floor = max(floor, _clamp(point, low, high))
        ordered.append(floor)
    return ordered


def _clamp(value: float, low: float, high: float) -> float:
    return min(max(value, low), high)


def _last_moment(attempt: AttemptRow) -> float:
    return max([attempt.started, *(v for v in attempt.moments.values() if v is not None)])


def run_segments(run: RunData) -> list[Segment]:
    """Every attempt's segments, plus ``other`` for gaps before, between and after attempts."""
    segments: list[Segment] = []
    cursor = run.started
    attempts = sorted(run.attempts, key=lambda a: a.started)
    for index, attempt in enumerate(attempts):
        following = attempts[index + 1].started if index + 1 < len(attempts) else run.ended
        begin = max(cursor, attempt.started)
        if begin > cursor:
            segments.append(Segment("other", cursor, begin, 0))
        end = min(max(begin, attempt.ended or following), max(begin, following))
        shifted = replace(attempt, started=begin)
        segments.extend(attempt_segments(shifted, end))
        cursor = max(cursor, end)
    if run.ended > cursor:
        segments.append(Segment("other", cursor, run.ended, 0))
    return segments


def totals(segments: Iterable[Segment]) -> dict[str, float]:
    """Seconds per kind (every kind present, zeros included)."""
    found = dict.fromkeys(KINDS, 0.0)
    for segment in segments:
        found[segment.kind] += segment.seconds
    return found
