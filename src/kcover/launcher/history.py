"""The run history: every run, attempt and fault in an embedded SQLite database.

Lives at ``<state dir>/kcover.db``; ``kcover history`` reads it.  A database
that SQLite cannot read is moved aside (``kcover.db.corrupt-<time>``), named in
a warning, and a new one is started: nothing else in the state dir is touched.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kcover.faults import Fault, Verdict
from kcover.report import verdict_to_dict

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY, started REAL NOT NULL, ended REAL, status TEXT NOT NULL,
    command TEXT NOT NULL, restarts INTEGER NOT NULL DEFAULT 0, ettr REAL,
    root_category TEXT, root_rule TEXT, reason TEXT
);
CREATE TABLE IF NOT EXISTS attempts (
    run_id INTEGER NOT NULL REFERENCES runs(id), number INTEGER NOT NULL, started REAL NOT NULL,
    ended REAL, nodes TEXT NOT NULL, outcome TEXT, verdict TEXT, decision TEXT, reason TEXT,
    PRIMARY KEY (run_id, number)
);
CREATE TABLE IF NOT EXISTS faults (
    run_id INTEGER NOT NULL, attempt INTEGER NOT NULL, rule TEXT NOT NULL, category TEXT NOT NULL,
    severity TEXT NOT NULL, role TEXT NOT NULL, rank INTEGER, node TEXT, count INTEGER NOT NULL,
    source TEXT, line_number INTEGER, line TEXT NOT NULL
);
"""


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


class History:
    """Append-only record of runs; one connection, used from one thread."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.warning: str | None = None
        self.db = self._open()

    def _open(self) -> sqlite3.Connection:
        try:
            db = sqlite3.connect(self.path)
            db.executescript(SCHEMA)
            db.execute("SELECT count(*) FROM runs").fetchone()
            return db
        except sqlite3.DatabaseError as exc:
            aside = self.path.with_name(f"{self.path.name}.corrupt-{int(time.time())}")
            self.path.replace(aside)
            self.warning = f"state database {self.path} was unreadable ({exc}); moved to {aside.name}, starting anew"
            db = sqlite3.connect(self.path)
            db.executescript(SCHEMA)
            return db

    def begin_run(self, command: Sequence[str], now: float) -> int:
        cursor = self.db.execute(
            "INSERT INTO runs (started, status, command) VALUES (?, 'running', ?)", (now, json.dumps(list(command)))
        )
        self.db.commit()
        assert cursor.lastrowid is not None
        return cursor.lastrowid

    def begin_attempt(self, run_id: int, number: int, nodes: Sequence[str], now: float) -> None:
        self.db.execute(
            "INSERT INTO attempts (run_id, number, started, nodes) VALUES (?, ?, ?, ?)",
            (run_id, number, now, json.dumps(list(nodes))),
        )
        self.db.commit()

    def end_attempt(
        self, run_id: int, number: int, now: float, outcome: str, verdict: Verdict, decision: str, reason: str
    ) -> None:
        self.db.execute(
            "UPDATE attempts SET ended=?, outcome=?, verdict=?, decision=?, reason=? WHERE run_id=? AND number=?",
            (now, outcome, json.dumps(verdict_to_dict(verdict)), decision, reason, run_id, number),
        )
        self.db.executemany(
            "INSERT INTO faults VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [_fault_row(run_id, number, fault) for fault in verdict.faults],
        )
        self.db.commit()

    def end_run(self, run_id: int, now: float, status: str, restarts: int, ettr: float | None,
                root: Fault | None, reason: str) -> None:
        self.db.execute(
            "UPDATE runs SET ended=?, status=?, restarts=?, ettr=?, root_category=?, root_rule=?, reason=? WHERE id=?",
            (now, status, restarts, ettr, root.category.value if root else None, root.rule if root else None,
             reason, run_id),
        )
        self.db.commit()

    def runs(self, limit: int = 20) -> list[RunRow]:
        rows = self.db.execute(
            "SELECT id, started, ended, status, command, restarts, ettr, root_category, root_rule, reason "
            "FROM runs ORDER BY id DESC LIMIT ?", (limit,)
        ).fetchall()
        return [RunRow(*row) for row in rows]

    def faults(self, run_id: int) -> list[dict[str, Any]]:
        cursor = self.db.execute(
            "SELECT attempt, rule, category, role, rank, node, count, line FROM faults WHERE run_id=? "
            "ORDER BY attempt, rowid", (run_id,)
        )
        names = [d[0] for d in cursor.description]
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]

    def close(self) -> None:
        self.db.close()


def _fault_row(run_id: int, attempt: int, fault: Fault) -> tuple[Any, ...]:
    return (
        run_id, attempt, fault.rule, fault.category.value, fault.severity.value, fault.role.value,
        fault.rank, fault.node, fault.count, fault.evidence.source, fault.evidence.line_number, fault.evidence.line,
    )
