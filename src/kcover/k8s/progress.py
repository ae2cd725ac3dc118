"""A job's productive time on Kubernetes: each pod's progress, and ETTR from it.

ETTR (effective training time ratio) is counted as ``kcover run`` counts it
(:mod:`kcover.launcher.reporting`): a run of the job's workers is productive
from its first step to its last complete checkpoint — the work after that
checkpoint is done again — or up to now while it runs, or to the job's end
when it succeeds.  Start-up, detection, restarts and backoff are lost.

On Kubernetes a *run* is one attempt of the pods, or one generation of an
in-place restart.  The node agent records each pod's run in the pod's
``kcover.io/progress`` annotation (:class:`PodProgress`: when the first step
came, the newest checkpoint and when it was complete).  When the operator
claims a restart it closes the run (:func:`closed_run`) and adds its
productive seconds to the job's recovery record; the job's ETTR is then
``(closed runs + the live run) ÷ time since the job was created``
(:func:`job_ettr`), computed by whoever asks (the operator's
``kcover_job_ettr`` metric at each scrape, ``kcover status``).  Pure: no I/O, no
clock.

Checkpoints are known only from ``kcover pod`` (which reads the SDK's
``kcover.checkpointed(step)``); without it a failed run counts as lost, as in
``kcover run`` without checkpoint reports.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

MAX_STEP = 10**15
EPOCH_LIMIT = 4_102_444_800.0
"""2100-01-01: a time beyond it (or before 1970) in an annotation is unreadable, not a far future."""


@dataclass(frozen=True)
class PodProgress:
    """``kcover.io/progress``: one pod's run as its node agent saw it (times in epoch seconds)."""

    first: float
    """When the run's first step came."""
    generation: int | None = None
    """The ``kcover pod`` generation of the run (None: the pod does not run ``kcover pod``)."""
    checkpoint: int | None = None
    """The newest step with a complete checkpoint in this run."""
    checkpoint_at: float | None = None

    def encode(self) -> str:
        written: dict[str, Any] = {"first": round(self.first, 3)}
        if self.generation is not None:
            written["generation"] = self.generation
        if self.checkpoint is not None and self.checkpoint_at is not None:
            written |= {"checkpoint": self.checkpoint, "checkpoint_at": round(self.checkpoint_at, 3)}
        return json.dumps(written, separators=(",", ":"))

    @classmethod
    def decode(cls, text: str | None) -> PodProgress | None:
        """The progress in an annotation; None when absent or unreadable (anyone who may patch the pod writes it)."""
        if not text or len(text) > 1000:
            return None
        try:
            raw = json.loads(text)
        except (ValueError, RecursionError):
            return None
        if not isinstance(raw, dict):
            return None
        first = _moment(raw.get("first"))
        if first is None:
            return None
        checkpoint, checkpoint_at = _whole(raw.get("checkpoint")), _moment(raw.get("checkpoint_at"))
        if checkpoint is None or checkpoint_at is None or checkpoint_at < first:
            checkpoint = checkpoint_at = None
        return cls(first, _whole(raw.get("generation")), checkpoint, checkpoint_at)


def _whole(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_STEP else None


def _moment(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < EPOCH_LIMIT:
        return None  # compared before float(): a 400-digit integer would overflow it; nan compares false
    return float(value)


def closed_run(pods: Sequence[PodProgress | None], since: float | None = None, until: float | None = None) -> float:
    """The productive seconds of a run that failed: from its first step (the earliest pod's) to the checkpoint
    every pod that stepped has (the pod with the oldest newest checkpoint); 0 when a pod that stepped has none.

    Clamped to the run's own time, from ``since`` (when the attempt began) to ``until`` (now): anyone who may
    patch a pod writes its annotations, and a record of productive time must not grow by what they wrote.
    """
    stepped = [p for p in pods if p is not None]
    if not stepped or any(p.checkpoint_at is None for p in stepped):
        return 0.0
    first = min(p.first for p in stepped)
    oldest = min(stepped, key=lambda p: (p.checkpoint or 0, p.checkpoint_at or 0.0))
    end = oldest.checkpoint_at or first
    first, end = max(first, since) if since is not None else first, min(end, until) if until is not None else end
    return max(0.0, end - first)


def live_run(pods: Sequence[PodProgress | None], until: float, since: float | None = None) -> float:
    """The productive seconds of the run going on (or that succeeded at ``until``): its first step (not before
    ``since``, when the attempt began) to ``until``."""
    firsts = [p.first for p in pods if p is not None]
    if not firsts:
        return 0.0
    first = max(min(firsts), since) if since is not None else min(firsts)
    return max(0.0, until - first)


@dataclass(frozen=True)
class Ettr:
    """A job's productive seconds, wall seconds since it was created, and their ratio."""

    productive: float
    wall: float

    @property
    def ratio(self) -> float:
        return min(1.0, self.productive / self.wall) if self.wall > 0 else 0.0


def job_ettr(began: float | None, until: float, closed: float, live: float) -> Ettr | None:
    """ETTR from the job's creation (``began``) to ``until``: the closed runs' seconds plus the live run's; None
    when the start is unknown or not before ``until``."""
    if began is None or not until > began:
        return None
    wall = until - began
    productive = min(wall, max(0.0, closed if math.isfinite(closed) else 0.0) + max(0.0, live))
    return Ettr(productive, wall)
