"""Read one run of the history database into a :class:`~kcover.runreport.model.RunData`.

The database is opened read-only through :class:`~kcover.launcher.history.History`
(never created, changed or moved; a locked or damaged one is a
:class:`~kcover.launcher.history.HistoryError`).  A database written before the
report's columns existed still loads: missing columns read as ``NULL`` and the
page draws what it can.  Numbers are cleaned here — ``nan``, infinities and
non-numbers become ``None``, unreadable JSON an empty value — so nothing
downstream has to distrust them.  Only a thinned share of the step samples is read
(:data:`PROGRESS_BUDGET` for the whole run), so a long run loads fast.
"""

from __future__ import annotations

import json
import math
import sqlite3
from pathlib import Path
from typing import Any

from kcover.launcher.history import History
from kcover.runreport.model import AttemptRow, FaultRow, RunData, Straggler, TrendPoint

TREND_RUNS = 100
"""Runs shown in the ETTR trend (the newest)."""
MOMENTS = ("launched", "first_progress", "last_checkpoint", "first_fault", "stop_began", "stopped")
RUN_COLUMNS = ("id", "started", "ended", "status", "command", "restarts", "ettr", "reason", "run_dir",
               "nproc_per_node", "excluded")
ATTEMPT_COLUMNS = ("number", "started", "ended", "nodes", "outcome", "verdict", "decision", "reason", "timings")
FAULT_COLUMNS = ("attempt", "rule", "category", "severity", "role", "rank", "node", "count", "source",
                 "line_number", "line", "at")
Samples = tuple[tuple[float, int], ...]
PROGRESS_BUDGET = 20000
"""Step samples (and, apart, checkpoints) read for the whole run; each attempt gets an equal share."""
MIN_SAMPLES = 8
PROGRESS_GROUPS = ("SELECT attempt, checkpoint, min(rowid), max(rowid), count(*) FROM progress WHERE run_id=? "
                   "GROUP BY attempt, checkpoint")
"""Each attempt's steps and checkpoints: an attempt's rows are written at once, so their rowids are contiguous."""
CHUNK = 900
"""Rowids asked for per query (below SQLite's limit of bound parameters)."""


class UnknownRunError(LookupError):
    """The database holds no such run (or no run at all); the message says which."""


def load_run(database: Path, run_id: int | None) -> RunData:
    """Run ``run_id`` (the newest when ``None``) of ``database``.

    Raises HistoryError (unusable database), UnknownRunError or sqlite3.Error.
    """
    store = History(database, read_only=True)
    try:
        return _load(store.db, run_id)
    finally:
        store.close()


def _load(db: sqlite3.Connection, run_id: int | None) -> RunData:
    run = _run_row(db, run_id)
    number = int(run["id"])
    progress = _progress(db, number)
    attempts = tuple(_attempt(row, progress.get(int(row["number"]), ((), ()))) for row in _rows(
        db, "attempts", ATTEMPT_COLUMNS, "run_id=? ORDER BY number", (number,)))
    faults = tuple(_fault(row) for row in _rows(db, "faults", FAULT_COLUMNS, "run_id=? ORDER BY attempt, rowid",
                                               (number,)))
    started = finite(run["started"]) or 0.0
    return RunData(
        run_id=number, started=started, ended=_run_end(run, started, attempts), status=str(run["status"]),
        command=_command(run["command"]), restarts=int(finite(run["restarts"]) or 0), ettr=finite(run["ettr"]),
        reason=str(run["reason"] or ""), run_dir=run["run_dir"], nproc_per_node=_int(run["nproc_per_node"]),
        excluded=tuple(str(n) for n in _list(_json(run["excluded"], []))), attempts=attempts, faults=faults,
        trend=_trend(db), stragglers=_stragglers(db, number),
    )


def _run_row(db: sqlite3.Connection, run_id: int | None) -> dict[str, Any]:
    where = "1 ORDER BY id DESC LIMIT 1" if run_id is None else "id=?"
    rows = _rows(db, "runs", RUN_COLUMNS, where, () if run_id is None else (run_id,))
    if not rows:
        raise UnknownRunError("the history holds no runs yet" if run_id is None else f"no run {run_id} in the history")
    return rows[0]


def _rows(db: sqlite3.Connection, table: str, columns: tuple[str, ...], where: str,
          args: tuple[Any, ...]) -> list[dict[str, Any]]:
    """Rows of ``table`` as dicts; a column (or table) the database lacks reads as ``None`` (or no rows)."""
    present = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
    if not present:
        return []
    select = ", ".join(c if c in present else "NULL" for c in columns)
    cursor = db.execute(f"SELECT {select} FROM {table} WHERE {where}", args)
    return [dict(zip(columns, row, strict=True)) for row in cursor]


def _attempt(row: dict[str, Any], progress: tuple[Samples, Samples]) -> AttemptRow:
    timings = _json(row["timings"], {})
    timings = timings if isinstance(timings, dict) else {}
    verdict = _json(row["verdict"], {})
    return AttemptRow(
        number=int(row["number"]), started=finite(row["started"]) or 0.0, ended=finite(row["ended"]),
        nodes=tuple(str(n) for n in _list(_json(row["nodes"], []))),
        outcome=str(row["outcome"] or "running"), verdict=verdict if isinstance(verdict, dict) else {},
        decision=str(row["decision"] or ""), reason=str(row["reason"] or ""),
        moments={name: finite(timings.get(name)) for name in MOMENTS},
        max_step=_int(timings.get("max_step")), productive_seconds=finite(timings.get("productive_seconds")),
        steps=progress[0], checkpoints=progress[1],
    )


def _progress(db: sqlite3.Connection, run_id: int) -> dict[int, tuple[Samples, Samples]]:
    """Each attempt's (steps, checkpoints) as (moment, step) in time order, thinned evenly to the budget.

    Only the rowids wanted are read (every n-th of an attempt's contiguous rows, and its last one).
    """
    present = {row[1] for row in db.execute("PRAGMA table_info(progress)")}
    if not {"run_id", "attempt", "at", "step", "checkpoint"} <= present:
        return {}
    groups = db.execute(PROGRESS_GROUPS, (run_id,)).fetchall()
    keep = max(MIN_SAMPLES, PROGRESS_BUDGET // max(1, len({g[0] for g in groups})))
    wanted: set[int] = set()
    for _attempt, _kind, first, last, total in groups:
        wanted.update(range(first, last + 1, max(1, -(-total // keep))))
        wanted.add(last)
    ids = sorted(wanted)
    found: dict[int, tuple[list[tuple[float, int]], list[tuple[float, int]]]] = {}
    for index in range(0, len(ids), CHUNK):
        chunk = ids[index:index + CHUNK]
        marks = ",".join("?" * len(chunk))
        query = f"SELECT run_id, attempt, at, step, checkpoint FROM progress WHERE rowid IN ({marks})"
        for run, attempt, at, step, checkpoint in db.execute(query, chunk):
            moment, number, which = finite(at), _int(step), _int(attempt)
            if run == run_id and moment is not None and number is not None and which is not None:
                steps, checkpoints = found.setdefault(which, ([], []))
                (checkpoints if checkpoint else steps).append((moment, number))
    return {attempt: (tuple(sorted(s)), tuple(sorted(c))) for attempt, (s, c) in found.items()}


def _fault(row: dict[str, Any]) -> FaultRow:
    return FaultRow(
        attempt=_int(row["attempt"]) or 0, rule=str(row["rule"]), category=str(row["category"]),
        severity=str(row["severity"]), role=str(row["role"]), rank=_int(row["rank"]),
        node=None if row["node"] is None else str(row["node"]), count=max(1, _int(row["count"]) or 1),
        source=None if row["source"] is None else str(row["source"]), line_number=_int(row["line_number"]),
        line=str(row["line"]), at=finite(row["at"]),
    )


def _trend(db: sqlite3.Connection) -> tuple[TrendPoint, ...]:
    rows = _rows(db, "runs", ("id", "started", "status", "ettr"), "1 ORDER BY id DESC LIMIT ?", (TREND_RUNS,))
    return tuple(TrendPoint(int(r["id"]), finite(r["started"]) or 0.0, str(r["status"]), finite(r["ettr"]))
                 for r in reversed(rows))


def _stragglers(db: sqlite3.Connection, run_id: int) -> tuple[Straggler, ...]:
    """Rows of a ``stragglers`` table, as ``kcover run`` writes it (absent in older databases)."""
    rows = _rows(db, "stragglers", ("attempt", "rank", "node", "detail"), "run_id=?", (run_id,))
    return tuple(Straggler(_int(r["attempt"]) or 0, _int(r["rank"]), None if r["node"] is None else str(r["node"]),
                           str(r["detail"] or "")) for r in rows)


def _run_end(run: dict[str, Any], started: float, attempts: tuple[AttemptRow, ...]) -> float:
    """The run's end; for a run that never recorded one (lost, running), the last moment known."""
    known = [started] + [t for a in attempts for t in (a.started, a.ended, *a.moments.values()) if t is not None]
    ended = finite(run["ended"])
    if ended is not None and ended >= started:
        return ended
    return max(known)


def finite(value: Any) -> float | None:
    """``value`` as a finite float, else ``None`` (nan, infinities, text, missing)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _int(value: Any) -> int | None:
    number = finite(value)
    return None if number is None or abs(number) > 2**62 else int(number)


def _json(text: Any, default: Any) -> Any:
    if not isinstance(text, str):
        return default
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return default


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _command(text: Any) -> str:
    words = _json(text, None)
    if isinstance(words, list):
        return " ".join(str(w) for w in words)
    return str(text or "")
