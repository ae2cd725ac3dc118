"""Stragglers on Kubernetes: the slow rank found across pods while the job runs.

Each pod's node agent records its ranks' newest compute seconds per step
(``kcover.io/step-times``, from ``kcover pod``: the SDK's ``kcover.timed``).
Only the operator sees every pod of a job, so it runs the straggler detector
(:mod:`kcover.decide.straggler`, the same one ``kcover run`` uses): one per
job and attempt (a restart may move a rank to another node, whose baseline is
learned afresh), fed each step once (in groups of steps for jobs of more than
:data:`FULL_RANKS` ranks).  :class:`StragglerWatch` says which
ranks became stragglers and which recovered; the operator's
:class:`~kcover.k8s.operator.straggler_desk.StragglerDesk` posts an Event,
sets ``kcover_straggler_slowdown{namespace,job,node,rank}`` and records the
current stragglers on the job (``kcover.io/stragglers``, read by
``kcover status``).  With ``kcover.io/straggler-action: replace`` a new
straggler is judged as ``kcover run`` judges one
(:func:`~kcover.decide.straggler_action.judge_replace`, inputs from
:func:`replace_case`), and when replacing its node pays the job is
restarted without it.  No I/O here.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, replace

from kcover.decide.straggler import Straggler, StragglerConfig, StragglerDetector
from kcover.decide.straggler_action import ReplaceCase
from kcover.k8s.names import STRAGGLERS
from kcover.k8s.operator.record import RecoveryRecord
from kcover.k8s.operator.views import JobView, PodView
from kcover.k8s.wire import MAX_TIMED_STEPS

JobKey = tuple[str, str, str]
FULL_RANKS = 1024
"""Up to this many ranks every step is judged; a larger job's steps are judged in groups (the mean of each
rank's ``ceil(ranks / FULL_RANKS)`` consecutive steps), so a look costs about the same at any size — in pure
Python each timing fed costs some 20 µs, and a 16,000-rank job makes 160,000 timings a second at 0.1 s a step."""
MAX_GROUP = MAX_TIMED_STEPS // 2
"""Groups stay within the newest steps the agents keep, looked at every few seconds."""
LAG = 4 * MAX_TIMED_STEPS
"""A step waits this many newer steps for a rank that has not reported it: pods' batches arrive at different
moments (``kcover pod`` sends 32 steps at a time, the agent writes at most once a second)."""


@dataclass(frozen=True)
class Flagged:
    """A rank judged slow, where it runs."""

    rank: int
    node: str
    pod: str
    slowdown: float
    since_step: int
    judgement: str = ""
    """With ``replace``: whether its node is replaced, and why (one line)."""

    def describe(self) -> str:
        said = (f"rank {self.rank} (pod {self.pod} on node {self.node}) is a straggler: computes "
                f"{self.slowdown:.2f}x its own baseline since step {self.since_step}")
        return f"{said}; {self.judgement}" if self.judgement else said

    def to_dict(self) -> dict[str, object]:
        found: dict[str, object] = {"rank": self.rank, "node": self.node, "pod": self.pod,
                                    "slowdown": round(self.slowdown, 3), "since_step": self.since_step}
        return found | ({"judgement": self.judgement} if self.judgement else {})


@dataclass(frozen=True)
class StragglerNews:
    """What changed in one look at a job: ranks newly flagged, ranks that recovered, and all flagged now."""

    new: tuple[Flagged, ...] = ()
    cleared: tuple[Flagged, ...] = ()
    current: tuple[Flagged, ...] = ()
    stale: bool = False
    """The job records stragglers this watch never flagged (an earlier leader's, or an earlier attempt's)."""
    restarted: bool = False
    """The ``cleared`` ranks were not judged healthy: the job restarted, and its watch starts again."""

    @property
    def changed(self) -> bool:
        return bool(self.new or self.cleared or self.stale)


@dataclass
class _JobWatch:
    attempt: int
    detector: StragglerDetector
    fed: dict[int, int] = field(default_factory=dict)
    """The newest step fed per rank."""
    flagged: dict[int, Flagged] = field(default_factory=dict)
    replacing: Flagged | None = None
    """A straggler whose node is to be replaced: kept until the restart is claimed (a claim may conflict)."""
    group: int = 0
    """Steps per value fed to the detector (0: not chosen yet; see :data:`FULL_RANKS`)."""
    ranks: int = 0
    """The most ranks seen reporting step times: each step waits for all of them (or ``lag`` newer steps)."""
    partial: dict[int, tuple[int, float, int]] = field(default_factory=dict)
    """Per rank, the group being summed: (group, seconds, steps)."""

    def grouped(self, rank: int, step: int, seconds: float) -> list[tuple[int, int, float]]:
        """(group, rank, mean seconds) of the rank's group that this step completes, if any: the mean of a group
        of which at least half the steps were timed."""
        if self.group <= 1:
            return [(step, rank, seconds)]
        group = step // self.group
        found = []
        current = self.partial.get(rank)
        if current is not None and current[0] != group:
            if current[2] * 2 >= self.group:
                found.append((current[0], rank, current[1] / current[2]))
            current = None
        total, count = (current[1], current[2]) if current else (0.0, 0)
        self.partial[rank] = (group, total + seconds, count + 1)
        return found


class StragglerWatch:
    """One detector per job and attempt, fed from the pods' step times (see the module docstring)."""

    def __init__(self, config: StragglerConfig | None = None) -> None:
        self.config = config or StragglerConfig(lag=LAG)
        self.jobs: dict[JobKey, _JobWatch] = {}

    def look(self, job: JobView, attempt: int, pods: Sequence[PodView]) -> StragglerNews:
        """Feed the job's new step times and say what changed."""
        watch = self.jobs.get(job.key)
        if watch is None or watch.attempt != attempt:
            cleared = tuple(watch.flagged.values()) if watch else ()
            watch = self.jobs[job.key] = _JobWatch(attempt, StragglerDetector(self.config))
            if cleared or decode(job.annotations.get(STRAGGLERS)):
                return StragglerNews(cleared=cleared, stale=True, restarted=bool(cleared))
        where = {rank: pod for pod in pods if (times := pod.times) is not None for rank in times.ranks}
        if len(where) > watch.ranks:  # more pods wrote their step times: expect them all from now on
            group = min(MAX_GROUP, -(-len(where) // FULL_RANKS))
            if group != watch.group and watch.group:  # judged another way: start again (the baselines too)
                watch = self.jobs[job.key] = _JobWatch(attempt, StragglerDetector(self.config),
                                                       flagged=watch.flagged)
            watch.group, watch.ranks = group, len(where)
            watch.detector.expect(len(where))
        fresh: list[tuple[int, int, float]] = []
        for rank, pod in where.items():
            steps = pod.times.ranks[rank] if pod.times else {}
            fed = watch.fed.get(rank, -1)
            for step in sorted(s for s in steps if s > fed):
                fresh.extend(watch.grouped(rank, step, steps[step]))
            watch.fed[rank] = max([fed, *steps])
        for step, rank, seconds in sorted(fresh):  # step by step, every rank's, as the detector expects
            watch.detector.observe(rank, step, seconds)
        now = {s.rank: self._flagged(s, where, watch) for s in watch.detector.stragglers()}
        new = tuple(f for rank, f in now.items() if rank not in watch.flagged)
        cleared = tuple(f for rank, f in watch.flagged.items() if rank not in now)
        # a flagged rank keeps where it was flagged (its metric's labels); only its slowdown follows the detector
        watch.flagged = {rank: replace(watch.flagged[rank], slowdown=f.slowdown) if rank in watch.flagged else f
                         for rank, f in now.items()}
        return StragglerNews(new, cleared, tuple(watch.flagged.values()))

    def judged(self, key: JobKey, flagged: Flagged, replacing: bool) -> Flagged:
        """Keep a new straggler's judgement (said in its Event and kept in the job's record), and whether its
        node is to be replaced (the first such straggler's is)."""
        watch = self.jobs[key]
        kept = watch.flagged[flagged.rank] = replace(watch.flagged[flagged.rank], judgement=flagged.judgement)
        if replacing and watch.replacing is None:
            watch.replacing = kept
        return kept

    def replacing(self, key: JobKey) -> Flagged | None:
        """The straggler whose node is to be replaced, until the job's attempt changes."""
        watch = self.jobs.get(key)
        return watch.replacing if watch else None

    def give_up_replacing(self, key: JobKey) -> None:
        """The straggler's node will not be replaced (the restart budget is spent): it stays reported."""
        watch = self.jobs.get(key)
        if watch is not None:
            watch.replacing = None

    def forget(self, key: JobKey) -> tuple[Flagged, ...]:
        """A job that is gone or finished: its flags, to clear them."""
        watch = self.jobs.pop(key, None)
        return tuple(watch.flagged.values()) if watch else ()

    def gone(self, present: Collection[JobKey]) -> list[tuple[JobKey, Flagged]]:
        """Forget the jobs no longer watched (deleted, or opted out); their flags, to clear their gauges."""
        return [(key, flagged) for key in [k for k in self.jobs if k not in present]
                for flagged in self.forget(key)]

    @staticmethod
    def _flagged(straggler: Straggler, where: dict[int, PodView], watch: _JobWatch) -> Flagged:
        pod = where.get(straggler.rank)
        earlier = watch.flagged.get(straggler.rank)
        return Flagged(straggler.rank, (pod.node if pod else None) or (earlier.node if earlier else "?"),
                       pod.name if pod else (earlier.pod if earlier else "?"), straggler.slowdown,
                       straggler.since_step)


def encode(flagged: Sequence[Flagged]) -> str:
    """``kcover.io/stragglers``: the ranks flagged now (an empty list once none is)."""
    return json.dumps([f.to_dict() for f in flagged], separators=(",", ":"))


def decode(text: str | None) -> list[dict[str, object]]:
    """The stragglers recorded on a job, for ``kcover status``; unreadable entries are skipped."""
    try:
        raw = json.loads(text) if text and len(text) < 100_000 else []
    except (ValueError, RecursionError):
        return []
    found = []
    for entry in raw if isinstance(raw, list) else []:
        if (isinstance(entry, dict) and isinstance(entry.get("rank"), int) and isinstance(entry.get("node"), str)
                and isinstance(entry.get("slowdown"), int | float) and not isinstance(entry.get("slowdown"), bool)
                and -1e6 < entry["slowdown"] < 1e6):
            found.append({"rank": entry["rank"], "node": entry["node"][:253], "pod": str(entry.get("pod", ""))[:253],
                          "slowdown": float(entry["slowdown"]),
                          "since_step": step if isinstance(step := entry.get("since_step"), int) else None,
                          "judgement": str(entry.get("judgement", ""))[:500]})
    return found


def replace_case(flagged: Flagged, pods: Sequence[PodView], job: JobView, record: RecoveryRecord,
                 total_steps: int | None, spares: int) -> ReplaceCase:
    """What :func:`~kcover.decide.straggler_action.judge_replace` needs, from the job's current pods.

    The pace is the median, over the newest steps, of the slowest rank's compute seconds (the waiting in
    collectives left out: the gain is underestimated, never overstated); the restart cost is the last
    restart's decision (or the job's creation) to this run's first step; the work to redo runs from the
    oldest newest checkpoint of the pods (from step 0 without one).
    """
    slowest: dict[int, float] = {}
    for pod in pods:
        times = pod.times
        for steps in times.ranks.values() if times else ():
            for step, seconds in steps.items():
                slowest[step] = max(slowest.get(step, 0.0), seconds)
    newest = max(slowest) if slowest else None
    recent = sorted(slowest[step] for step in sorted(slowest)[-16:])
    pace = recent[len(recent) // 2] if recent else None
    runs = [run for pod in pods if (run := pod.run) is not None]
    first = min((run.first for run in runs), default=None)
    started = record.restarted_at.timestamp() if record.restarted_at else job.created
    restart = first - started if first is not None and started is not None and first >= started else None
    checkpoints = [run.checkpoint for run in runs if run.checkpoint is not None]
    redo_from = min(checkpoints) if checkpoints and len(checkpoints) == len(runs) else 0
    remaining = total_steps - newest - 1 if total_steps is not None and newest is not None else None
    return ReplaceCase(slowdown=flagged.slowdown, spares=spares, remaining_steps=remaining, step_seconds=pace,
                       restart_seconds=restart, redo_steps=max(0, (newest or 0) - redo_from))
