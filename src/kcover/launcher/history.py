"""The run history: every run, attempt and fault in an embedded SQLite database.

Lives at ``<state dir>/kcover.db``; ``kcover run`` writes it, ``kcover history``
reads it, read-only: a read never creates, changes or moves a file.  Only a file
SQLite says is not a database is moved aside (``kcover.db.corrupt-<time>``),
and only by ``kcover run``, named in a warning, and a new one is started:
nothing else in the state dir is touched.  A database locked by another process
is waited for (:data:`BUSY_WAIT` seconds), then, like an unreadable or damaged
one or a FIFO or folder in its place, reported as a :class:`HistoryError`.

Each run records its launcher's pid, process start time and host.  A run still
``running`` whose launcher is gone (``kill -9``, a crash, a reboot) reads as
``lost``; the start time keeps a reused pid from passing for the launcher, and a
run started on another host is never judged from here.  ``kcover run`` writes
``lost`` into such rows when it starts.

For ``kcover report`` each run also records its folder, layout and excluded
nodes, each attempt its moments (epoch seconds, JSON in ``attempts.timings``),
each fault when it was first seen (``faults.at``), and the ``progress`` table the
attempt's thinned step samples and checkpoints, and the ``stragglers`` table the
ranks the straggler detector flagged (attempt, rank, node, slowdown, since step,
first flagged at, action, detail).  Columns added since the first
schema are added to an older database when ``kcover run`` opens it; readers must
expect them missing.
"""

from __future__ import annotations

import json
import socket
import sqlite3
import stat
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import psutil

from kcover.faults import Fault, Verdict
from kcover.launcher.result import StragglerRecord
from kcover.launcher.spec import SpecError
from kcover.report import verdict_to_dict

BUSY_WAIT = 5.0
"""Seconds to wait for a database another process holds locked."""
LAUNCHER_COLUMNS = {"launcher_pid": "INTEGER", "launcher_start": "REAL", "launcher_host": "TEXT"}
ADDED_COLUMNS = {
    "runs": {**LAUNCHER_COLUMNS, "run_dir": "TEXT", "nproc_per_node": "INTEGER", "excluded": "TEXT"},
    "attempts": {"timings": "TEXT"},
    "faults": {"at": "REAL"},
    "stragglers": {"node": "TEXT", "slowdown": "REAL", "since_step": "INTEGER", "at": "REAL", "action": "TEXT",
                   "detail": "TEXT"},
}
"""Columns added after the first schema, per table: added to an older database when a run opens it."""
FAULT_COLUMNS = ("run_id", "attempt", "rule", "category", "severity", "role", "rank", "node", "count", "source",
                 "line_number", "line", "at")
START_TOLERANCE = 0.01
"""Seconds two readings of one process's start time may differ by (one clock tick)."""

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY, started REAL NOT NULL, ended REAL, status TEXT NOT NULL,
    command TEXT NOT NULL, restarts INTEGER NOT NULL DEFAULT 0, ettr REAL,
    root_category TEXT, root_rule TEXT, reason TEXT,
    launcher_pid INTEGER, launcher_start REAL, launcher_host TEXT,
    run_dir TEXT, nproc_per_node INTEGER, excluded TEXT
);
CREATE TABLE IF NOT EXISTS attempts (
    run_id INTEGER NOT NULL REFERENCES runs(id), number INTEGER NOT NULL, started REAL NOT NULL,
    ended REAL, nodes TEXT NOT NULL, outcome TEXT, verdict TEXT, decision TEXT, reason TEXT, timings TEXT,
    PRIMARY KEY (run_id, number)
);
CREATE TABLE IF NOT EXISTS faults (
    run_id INTEGER NOT NULL, attempt INTEGER NOT NULL, rule TEXT NOT NULL, category TEXT NOT NULL,
    severity TEXT NOT NULL, role TEXT NOT NULL, rank INTEGER, node TEXT, count INTEGER NOT NULL,
    source TEXT, line_number INTEGER, line TEXT NOT NULL, at REAL
);
CREATE TABLE IF NOT EXISTS progress (
    run_id INTEGER NOT NULL, attempt INTEGER NOT NULL, at REAL NOT NULL, step INTEGER NOT NULL,
    checkpoint INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS stragglers (
    run_id INTEGER NOT NULL, attempt INTEGER NOT NULL, rank INTEGER NOT NULL, node TEXT, slowdown REAL,
    since_step INTEGER, at REAL, action TEXT, detail TEXT
);
CREATE INDEX IF NOT EXISTS progress_by_attempt ON progress (run_id, attempt, checkpoint);
"""


@dataclass(frozen=True)
class AttemptTimeline:
    """When things happened in an attempt, in epoch seconds, as the history records it for ``kcover report``.

    ``moments`` names each moment (``launched``, ``first_progress``, ``last_checkpoint``, ``first_fault``,
    ``stop_began``, ``stopped``) plus ``max_step``, ``hung_at`` and ``productive_seconds``; ``faults`` maps
    (rule, rank, node) to when that fault was first seen; ``steps`` and ``checkpoints`` are (moment, step).
    """

    moments: dict[str, float | int | None] = field(default_factory=dict)
    faults: dict[tuple[str, int | None, str | None], float] = field(default_factory=dict)
    steps: tuple[tuple[float, int], ...] = ()
    checkpoints: tuple[tuple[float, int], ...] = ()


@dataclass(frozen=True)
class RunRow:
    id: int
    started: float
    ended: float | None
    status: str
    command: str
    restarts: int
    ettr: float | None
    root_category: str | None
    root_rule: str | None
    reason: str | None


class HistoryError(SpecError):
    """The database cannot be used (locked, unreadable, damaged, not a file); the message names it and why."""


class History:
    """Append-only record of runs; one connection, used from one thread; ``read_only`` never writes a byte."""

    def __init__(self, path: Path, read_only: bool = False) -> None:
        self.path = path
        self.read_only = read_only
        self.warning: str | None = None
        _refuse_non_file(path)
        self.db = self._open_read_only() if read_only else self._open()

    def _open_read_only(self) -> sqlite3.Connection:
        try:
            db = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True, timeout=BUSY_WAIT)
        except sqlite3.Error as exc:
            raise _history_error(self.path, exc) from None
        try:
            db.execute("SELECT count(*) FROM sqlite_master").fetchone()
        except sqlite3.Error as exc:
            db.close()
            raise _history_error(self.path, exc) from None
        return db

    def _open(self) -> sqlite3.Connection:
        try:
            return self._connect()
        except sqlite3.DatabaseError as exc:
            if exc.sqlite_errorcode != sqlite3.SQLITE_NOTADB:
                raise _history_error(self.path, exc) from None
            aside = self.path.with_name(f"{self.path.name}.corrupt-{int(time.time())}")
            self.path.replace(aside)
            self.warning = f"state database {self.path} was unreadable ({exc}); moved to {aside.name}, starting anew"
            return self._connect()

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=BUSY_WAIT)
        try:
            db.executescript(SCHEMA)
            for table, added in ADDED_COLUMNS.items():
                present = _columns(db, table)
                for column, kind in added.items():
                    if column not in present:
                        db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
            db.commit()
        except BaseException:
            db.close()
            raise
        return db

    def begin_run(self, command: Sequence[str], now: float, run_dir: str | None = None,
                  nproc_per_node: int | None = None) -> int:
        """Record a new run by this process (marking runs whose launcher is gone ``lost`` first)."""
        self.mark_lost()
        me = psutil.Process()
        cursor = self.db.execute(
            "INSERT INTO runs (started, status, command, launcher_pid, launcher_start, launcher_host, run_dir, "
            "nproc_per_node) VALUES (?, 'running', ?, ?, ?, ?, ?, ?)",
            (now, json.dumps(list(command)), me.pid, me.create_time(), socket.gethostname(), run_dir,
             nproc_per_node),
        )
        self.db.commit()
        assert cursor.lastrowid is not None
        return cursor.lastrowid

    def mark_lost(self) -> None:
        """Write ``lost`` into every ``running`` run whose launcher is gone."""
        for row in self.runs(limit=-1, status="running"):
            if row.status == "lost":
                self.db.execute("UPDATE runs SET status='lost', reason=? WHERE id=? AND status='running'",
                                (row.reason, row.id))
        self.db.commit()
    def begin_attempt(self, run_id: int, number: int, nodes: Sequence[str], now: float) -> None:
        self.db.execute(
            "INSERT INTO attempts (run_id, number, started, nodes) VALUES (?, ?, ?, ?)",
            (run_id, number, now, json.dumps(list(nodes))),
        )
        self.db.commit()

    def end_attempt(
        self, run_id: int, number: int, now: float, outcome: str, verdict: Verdict, decision: str, reason: str,
        timeline: AttemptTimeline | None = None,
    ) -> None:
        """Record how an attempt ended, its faults and (``timeline``, epoch seconds) when things happened in it."""
        timeline = timeline or AttemptTimeline()
        self.db.execute(
            "UPDATE attempts SET ended=?, outcome=?, verdict=?, decision=?, reason=?, timings=? "
            "WHERE run_id=? AND number=?",
            (now, outcome, json.dumps(verdict_to_dict(verdict)), decision, reason,
             json.dumps(timeline.moments), run_id, number),
        )
        self.db.executemany(
            f"INSERT INTO faults ({', '.join(FAULT_COLUMNS)}) VALUES ({', '.join('?' * len(FAULT_COLUMNS))})",
            [(*_fault_row(run_id, number, fault), timeline.faults.get((fault.rule, fault.rank, fault.node)))
             for fault in verdict.faults],
        )
        self.db.executemany(
            "INSERT INTO progress VALUES (?, ?, ?, ?, ?)",
            [(run_id, number, at, step, 0) for at, step in timeline.steps]
            + [(run_id, number, at, step, 1) for at, step in timeline.checkpoints],
        )
        self.db.commit()

    def record_stragglers(self, run_id: int, attempt: int, stragglers: Sequence[StragglerRecord]) -> None:
        """The ranks flagged as stragglers in an attempt (``at`` in epoch seconds)."""
        self.db.executemany(
            "INSERT INTO stragglers (run_id, attempt, rank, node, slowdown, since_step, at, action, detail) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [(run_id, attempt, s.rank, s.node, s.slowdown, s.since_step, s.at, s.action, s.detail)
             for s in stragglers],
        )
        self.db.commit()

    def end_run(self, run_id: int, now: float, status: str, restarts: int, ettr: float | None,
                root: Fault | None, reason: str, excluded: Sequence[str] = ()) -> None:
        self.db.execute(
            "UPDATE runs SET ended=?, status=?, restarts=?, ettr=?, root_category=?, root_rule=?, reason=?, "
            "excluded=? WHERE id=?",
            (now, status, restarts, ettr, root.category.value if root else None, root.rule if root else None,
             reason, json.dumps(list(excluded)), run_id),
        )
        self.db.commit()

    def runs(self, limit: int = 20, status: str | None = None) -> list[RunRow]:
        """The latest ``limit`` runs (all with -1), newest first, a gone launcher's ``running`` as ``lost``."""
        present = _columns(self.db, "runs")
        if not present:
            return []
        launcher = ", ".join(c if c in present else "NULL" for c in LAUNCHER_COLUMNS)
        rows = self.db.execute(
            "SELECT id, started, ended, status, command, restarts, ettr, root_category, root_rule, reason, "
            f"{launcher} FROM runs WHERE ? IS NULL OR status = ? ORDER BY id DESC LIMIT ?", (status, status, limit)
        ).fetchall()
        return [_judged(RunRow(*row[:10]), (row[10], row[11], row[12])) for row in rows]

    def faults(self, run_id: int) -> list[dict[str, Any]]:
        if not self.db.execute("SELECT 1 FROM sqlite_master WHERE name='faults'").fetchone():
            return []
        cursor = self.db.execute(
            "SELECT attempt, rule, category, role, rank, node, count, line FROM faults WHERE run_id=? "
            "ORDER BY attempt, rowid", (run_id,)
        )
        names = [d[0] for d in cursor.description]
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]

    def close(self) -> None:
        self.db.close()




def _refuse_non_file(path: Path) -> None:
    """A folder, FIFO or device where the database should be is an error (SQLite would block or fail)."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise HistoryError(f"cannot read state database {path}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(mode):
        raise HistoryError(f"state database {path} is not a regular file")


def _history_error(path: Path, exc: sqlite3.Error) -> HistoryError:
    code = getattr(exc, "sqlite_errorcode", None)
    if code in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
        return HistoryError(f"state database {path} is locked by another process (waited {BUSY_WAIT:g} s); "
                            "try again when it is released")
    if code == sqlite3.SQLITE_NOTADB:
        return HistoryError(f"{path} is not a SQLite database (the next kcover run moves it aside)")
    return HistoryError(f"cannot read state database {path}: {exc}")


def _columns(db: sqlite3.Connection, table: str) -> set[str]:
    return {row[1] for row in db.execute(f"PRAGMA table_info({table})")}


def _judged(row: RunRow, launcher: tuple[int | None, float | None, str | None]) -> RunRow:
    """``row`` as ``lost`` when it is still ``running`` but its launcher is gone."""
    if row.status != "running" or launcher_alive(*launcher):
        return row
    reason = f"kcover (pid {launcher[0]}) ended without recording how the run ended"
    return replace(row, status="lost", reason=row.reason or reason)


def launcher_alive(pid: int | None, started: float | None, host: str | None) -> bool:
    """Whether the launcher is still running; True where it cannot be told (old rows, another host)."""
    if pid is None or started is None or host != socket.gethostname():
        return True
    try:
        process = psutil.Process(pid)
        same = abs(process.create_time() - started) < START_TOLERANCE
        return same and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:
        return True


def _fault_row(run_id: int, attempt: int, fault: Fault) -> tuple[Any, ...]:
    return (
        run_id, attempt, fault.rule, fault.category.value, fault.severity.value, fault.role.value,
        fault.rank, fault.node, fault.count, fault.evidence.source, fault.evidence.line_number, fault.evidence.line,
    )
