"""The plain records a report is drawn from: a run, its attempts, faults, progress and the trend.

Built by :mod:`kcover.runreport.load` from the history database and by
:mod:`kcover.runreport.kube` from a Kubernetes job's records; the drawing modules only read them.
Times are epoch seconds and always finite: the loader turns ``nan``, infinite or
missing values into ``None`` so the charts never see them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class FaultRow:
    attempt: int
    rule: str
    category: str
    severity: str
    role: str
    rank: int | None
    node: str | None
    count: int
    source: str | None
    line_number: int | None
    line: str
    at: float | None


@dataclass(frozen=True)
class AttemptRow:
    number: int
    started: float
    ended: float | None
    nodes: tuple[str, ...]
    outcome: str
    verdict: dict[str, Any]
    decision: str
    reason: str
    moments: dict[str, float | None]
    """Epoch seconds of ``launched``, ``first_progress``, ``last_checkpoint``, ``first_fault``, ``stop_began``,
    ``stopped`` (absent in a database written before they were recorded)."""
    max_step: int | None = None
    productive_seconds: float | None = None
    steps: tuple[tuple[float, int], ...] = ()
    checkpoints: tuple[tuple[float, int], ...] = ()
    kept: tuple[tuple[str, str], ...] = ()
    """(pod, excerpt) of the log lines the operator kept as evidence of this attempt's failure (Kubernetes)."""


@dataclass(frozen=True)
class TrendPoint:
    run_id: int
    started: float
    status: str
    ettr: float | None


@dataclass(frozen=True)
class Straggler:
    """A rank the straggler detector reported as slow (``kcover run`` records them)."""

    attempt: int
    rank: int | None
    node: str | None
    detail: str


@dataclass(frozen=True)
class RunData:
    run_id: int
    started: float
    ended: float
    status: str
    command: str
    restarts: int
    ettr: float | None
    reason: str
    run_dir: str | None
    nproc_per_node: int | None
    excluded: tuple[str, ...]
    attempts: tuple[AttemptRow, ...]
    faults: tuple[FaultRow, ...]
    trend: tuple[TrendPoint, ...] = ()
    stragglers: tuple[Straggler, ...] = field(default=())
    title: str = ""
    """What the page calls the run (default: ``run <run_id>``), e.g. ``Job ns/name``."""
    notes: tuple[str, ...] = ()
    """Lines the page shows under its header: what the source did not record, or could not be read."""
    progress_recorded: bool = True
    """Whether steps and the moments of each attempt were recorded: when not (a Kubernetes job), the page leaves
    out ETTR, productive and lost time and step progress rather than showing them as zeros."""
