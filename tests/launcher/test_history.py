"""The run history database under hostile conditions: locked, not a database, a folder or FIFO in its place.

``kcover history`` only reads: whatever the database's state, it never moves,
creates or changes a file, and it says clearly what is wrong (exit 1).  ``kcover
run`` moves aside only a file SQLite says is not a database.  Runs whose launcher
is gone read as ``lost``, and a reused pid does not pass for the launcher.
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil

from kcover.launcher.history import History

WORKERS = Path(__file__).parent / "workers"
OLD_SCHEMA = """
CREATE TABLE runs (
    id INTEGER PRIMARY KEY, started REAL NOT NULL, ended REAL, status TEXT NOT NULL,
    command TEXT NOT NULL, restarts INTEGER NOT NULL DEFAULT 0, ettr REAL,
    root_category TEXT, root_rule TEXT, reason TEXT
);
INSERT INTO runs (started, status, command) VALUES (1700000000, 'succeeded', '["old"]');
"""


def kcover(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kcover", *args], capture_output=True, text=True, check=False,
                          timeout=120)


def history(state: Path, *options: str) -> subprocess.CompletedProcess[str]:
    return kcover("history", "--state-dir", str(state), *options)


def recorded_run(state: Path) -> Path:
    """A state dir holding one real, succeeded run; returns its database."""
    done = kcover("run", "--quiet", "--state-dir", str(state), "--", sys.executable, str(WORKERS / "ok.py"))
    assert done.returncode == 0, done.stderr[-2000:]
    return state / "kcover.db"


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


@contextmanager
def locked(database: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``database`` from this (other) process."""
    holder = sqlite3.connect(database, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        yield
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def test_history_of_a_locked_database_is_an_error_and_moves_nothing(tmp_path: Path) -> None:
    database = recorded_run(tmp_path / "state")
    before = snapshot(tmp_path / "state")
    with locked(database):
        done = history(tmp_path / "state")
    assert done.returncode == 1
    assert f"state database {database} is locked by another process" in done.stderr
    assert "Traceback" not in done.stderr
    assert snapshot(tmp_path / "state") == before
    assert "succeeded" in history(tmp_path / "state").stdout


def test_history_never_moves_a_file_that_is_not_a_database(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "kcover.db").write_bytes(b"this is not sqlite" * 100)
    done = history(state)
    assert done.returncode == 1
    assert "is not a SQLite database" in done.stderr
    assert sorted(p.name for p in state.iterdir()) == ["kcover.db"]
    assert (state / "kcover.db").read_bytes() == b"this is not sqlite" * 100


def test_a_folder_or_fifo_in_place_of_the_database_is_an_error(tmp_path: Path) -> None:
    for name, make in (("folder", os.mkdir), ("fifo", os.mkfifo)):
        state = tmp_path / name
        state.mkdir()
        make(state / "kcover.db")
        for done, code in ((history(state), 1),
                           (kcover("run", "--state-dir", str(state), "--", sys.executable, str(WORKERS / "ok.py")), 2)):
            assert done.returncode == code, (name, done.stderr)
            assert f"state database {state / 'kcover.db'} is not a regular file" in done.stderr
        assert [p.name for p in state.iterdir() if p.name.startswith("kcover.db")] == ["kcover.db"]


def test_run_on_a_locked_database_waits_then_refuses_and_starts_nothing(tmp_path: Path) -> None:
    database = recorded_run(tmp_path / "state")
    with locked(database):
        done = kcover("run", "--state-dir", str(tmp_path / "state"), "--", sys.executable, str(WORKERS / "ok.py"))
    assert done.returncode == 2
    assert "is locked by another process" in done.stderr
    assert not list((tmp_path / "state").glob("kcover.db.corrupt-*"))
    runs = json.loads(history(tmp_path / "state", "--json").stdout)
    assert [run["status"] for run in runs] == ["succeeded"]


def test_a_database_from_before_launcher_columns_is_read_and_extended(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    sqlite3.connect(state / "kcover.db").executescript(OLD_SCHEMA)
    runs = json.loads(history(state, "--json").stdout)
    assert [(run["status"], run["command"]) for run in runs] == [("succeeded", '["old"]')]
    recorded_run(state)
    runs = json.loads(history(state, "--json").stdout)
    assert [run["status"] for run in runs] == ["succeeded", "succeeded"]


def test_a_reused_pid_does_not_pass_for_the_launcher(tmp_path: Path) -> None:
    database = tmp_path / "kcover.db"
    me = psutil.Process()
    store = History(database)
    cases = [  # launcher pid, start time, host -> how the running run reads
        (me.pid, me.create_time(), socket.gethostname(), "running"),  # the launcher, alive
        (me.pid, me.create_time() - 60, socket.gethostname(), "lost"),  # its pid, reused by another process
        (me.pid, me.create_time() - 60, "another-host", "running"),  # cannot be told from here
        (None, None, None, "running"),  # recorded before launchers were: cannot be told
    ]
    for pid, started, host, _ in cases:
        store.db.execute("INSERT INTO runs (started, status, command, launcher_pid, launcher_start, launcher_host) "
                         "VALUES (0, 'running', '[]', ?, ?, ?)", (pid, started, host))
    store.db.commit()
    store.close()
    reader = History(database, read_only=True)
    assert [row.status for row in reversed(reader.runs())] == [case[3] for case in cases]
    reader.close()
    writer = History(database)
    writer.mark_lost()
    stored = writer.db.execute("SELECT status FROM runs ORDER BY id").fetchall()
    assert [status for (status,) in stored] == [case[3] for case in cases]
    writer.close()


def test_markup_and_escapes_in_commands_and_lines_are_shown_as_text(tmp_path: Path) -> None:
    state = tmp_path / "state"
    done = kcover("run", "--quiet", "--user-code-retries", "0", "--state-dir", str(state), "--",
                  sys.executable, str(WORKERS / "markup.py"), "[/]", "\x1b[2J")
    assert done.returncode == 1, done.stderr[-2000:]
    wide = {**os.environ, "COLUMNS": "400"}
    runs, faults = (subprocess.run([sys.executable, "-m", "kcover", "history", "--state-dir", str(state), *more],
                                   capture_output=True, text=True, check=False, timeout=120, env=wide)
                    for more in ([], ["--run", "1"]))
    for shown in (runs, faults):
        assert shown.returncode == 0, shown.stderr[-2000:]  # before: rich.errors.MarkupError, a traceback
        assert "Traceback" not in shown.stderr
        assert "\x1b" not in shown.stdout
    assert "[/]" in runs.stdout and "\\x1b[2J" in runs.stdout
    assert "[/red] labels" in faults.stdout
