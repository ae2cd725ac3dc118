"""Straggler watch of one attempt: timings in, flags reported, and the replace decision.

The attempt feeds :class:`StragglerWatch` every :class:`~kcover.launcher.output.TimingSeen`
(compute seconds from :func:`kcover.step_time`) and every new step, and asks it
once per watch tick what is new (:meth:`StragglerWatch.check`).  The pure
detector (:mod:`kcover.decide.straggler`) says which ranks are slow; a newly
flagged rank becomes one event line and a :class:`~kcover.launcher.result.StragglerRecord`
(its slowdown kept at the highest seen).  With ``--straggler-action replace``
the pure judgement (:mod:`kcover.decide.straggler_action`) weighs the gain of
finishing without the slow node against the measured restart cost; when it pays,
:meth:`check` returns the record to replace and the attempt ends so that the
supervisor restarts on a spare node.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, replace

from kcover.decide.straggler import Straggler, StragglerDetector
from kcover.decide.straggler_action import ReplaceCase, StragglerAction, judge_replace
from kcover.launcher.output import TimingSeen
from kcover.launcher.result import StragglerRecord

PACE_STEPS = 20
"""Recent steps the current pace (seconds per step) is measured over."""


@dataclass(frozen=True)
class WatchNews:
    """What one check found: event lines to print, and the straggler to replace (if replacing pays)."""

    lines: tuple[str, ...] = ()
    replace: StragglerRecord | None = None


class StragglerWatch:
    def __init__(self, action: StragglerAction, total_steps: int | None, spares: int,
                 nodes: Mapping[int, str]) -> None:
        self.action = action
        self.total_steps = total_steps
        self.spares = spares
        self.nodes = dict(nodes)
        self.detector = StragglerDetector()
        self.records: dict[int, StragglerRecord] = {}
        self.flagged: set[int] = set()
        self.pace: deque[tuple[float, int]] = deque(maxlen=PACE_STEPS)
        self.checkpoint_step: int | None = None
        self.first_step: int | None = None
        self.restart_seconds: float | None = None
        self.judgements: dict[int, str] = {}
        """What ``replace`` judged when the rank was first flagged (kept in its record's detail)."""

    def timing(self, seen: TimingSeen) -> None:
        self.detector.observe(seen.rank, seen.step, seen.seconds)

    def step(self, step: int, at: float, launched: float | None) -> None:
        """A new highest step of the job, at ``at``; the first one measures the restart cost."""
        if self.first_step is None:
            self.first_step = step
            self.restart_seconds = None if launched is None else at - launched
        self.pace.append((at, step))

    def checkpointed(self, step: int) -> None:
        self.checkpoint_step = max(step, self.checkpoint_step or step)

    def check(self, now: float) -> WatchNews:
        """New flags since the last check (and clears), and the straggler to replace if replacing pays.

        With ``replace``, every flagged rank is judged again at each check (the pace and the slowdown
        estimate firm up as steps come); a judgement is said when the rank is first flagged and when it
        turns to replacing.
        """
        current = {s.rank: s for s in self.detector.stragglers()}
        lines = [f"rank {rank} ({self._node(rank)}) is back to its usual pace"
                 for rank in sorted(self.flagged - set(current))]
        newly = sorted(set(current) - self.flagged)
        self.flagged = set(current)
        chosen = self._choose(current, newly) if self.action is StragglerAction.REPLACE else None
        for straggler in current.values():
            self._remember(straggler, now)
        if chosen is not None:
            self.records[chosen] = replace(self.records[chosen], action="replaced")
        said = [*newly, *([chosen] if chosen is not None and chosen not in newly else [])]
        lines.extend(self.records[rank].detail for rank in said)
        return WatchNews(tuple(lines), None if chosen is None else self.records[chosen])

    def _choose(self, current: Mapping[int, Straggler], newly: list[int]) -> int | None:
        """The slowest flagged rank whose replacement pays, if any; remembers the judgements to say."""
        for rank in sorted(current, key=lambda r: (-current[r].slowdown, r)):
            judgement = judge_replace(self._case(current[rank]))
            if rank in newly or judgement.replace:
                self.judgements[rank] = judgement.reason
            if judgement.replace:
                return rank
        return None

    def _remember(self, straggler: Straggler, now: float) -> None:
        rank = straggler.rank
        old = self.records.get(rank)
        if old is not None and old.action != "reported":
            return
        slowdown = max(straggler.slowdown, old.slowdown if old else 0.0)
        since = old.since_step if old else straggler.since_step
        detail = (f"rank {rank} ({self._node(rank)}) is a straggler: computes {slowdown:.2f}x its own baseline "
                  f"relative to its peers since step {since}")
        if rank in self.judgements:
            detail += f"; {self.judgements[rank]}"
        self.records[rank] = StragglerRecord(rank, self._node(rank), slowdown, since, old.at if old else now,
                                             "reported", detail)

    def _case(self, straggler: Straggler) -> ReplaceCase:
        newest = self.pace[-1][1] if self.pace else None
        remaining = None if self.total_steps is None or newest is None else self.total_steps - newest - 1
        redo_from = self.checkpoint_step if self.checkpoint_step is not None else self.first_step
        return ReplaceCase(slowdown=straggler.slowdown, spares=self.spares, remaining_steps=remaining,
                           step_seconds=self._step_seconds(), restart_seconds=self.restart_seconds,
                           redo_steps=0 if newest is None or redo_from is None else newest - redo_from)

    def _step_seconds(self) -> float | None:
        if len(self.pace) < 2:
            return None
        (first_at, first), (last_at, last) = self.pace[0], self.pace[-1]
        return (last_at - first_at) / (last - first) if last > first else None

    def _node(self, rank: int) -> str:
        return self.nodes.get(rank, "?")

    def freeze(self) -> tuple[StragglerRecord, ...]:
        return tuple(self.records[rank] for rank in sorted(self.records))
