"""``kcover report`` refuses bad input in one line, with a non-zero exit, no traceback and no half-written file."""

from __future__ import annotations

import os
import sqlite3
import sys
from pathlib import Path
from typing import Any

import pytest
from tests.runreport.conftest import kcover

from kcover.launcher.history import History


def one_clean_line(done: Any) -> str:
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("kcover: ")
    return str(lines[0])


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp") or p.name.startswith("."))


def test_no_database_is_a_usage_error(tmp_path: Path) -> None:
    done = kcover("report", "--state-dir", str(tmp_path))
    assert done.returncode == 2
    assert "no run history in" in one_clean_line(done)
    assert list(tmp_path.iterdir()) == []  # nothing created, the database included


def test_an_empty_database_says_there_are_no_runs(tmp_path: Path) -> None:
    History(tmp_path / "kcover.db").close()
    done = kcover("report", "--state-dir", str(tmp_path), "-o", str(tmp_path / "r.html"))
    assert done.returncode == 2
    assert "no runs yet" in one_clean_line(done)
    assert not (tmp_path / "r.html").exists()


def test_an_unknown_run_is_named(recorded: dict[str, Any], tmp_path: Path) -> None:
    done = kcover("report", "42", "--state-dir", str(recorded["state"]), "-o", str(tmp_path / "r.html"))
    assert done.returncode == 2
    assert "no run 42 in the history" in one_clean_line(done)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("run", ["0", "-1", "one", "nan"])
def test_a_run_that_is_not_a_number_from_1_is_a_usage_error(run: str, tmp_path: Path) -> None:
    done = kcover("report", run, "--state-dir", str(tmp_path))
    assert done.returncode == 2
    one_clean_line(done)


def test_a_folder_as_output_is_refused(recorded: dict[str, Any], tmp_path: Path) -> None:
    done = kcover("report", "--state-dir", str(recorded["state"]), "-o", str(tmp_path))
    assert done.returncode == 2
    assert "is a folder" in one_clean_line(done)
    assert list(tmp_path.iterdir()) == []


def test_output_in_a_missing_folder_is_refused(recorded: dict[str, Any], tmp_path: Path) -> None:
    done = kcover("report", "--state-dir", str(recorded["state"]), "-o", str(tmp_path / "nope" / "r.html"))
    assert done.returncode == 2
    assert "does not exist" in one_clean_line(done)


def test_an_unwritable_output_fails_cleanly(recorded: dict[str, Any], tmp_path: Path) -> None:
    """As root a read-only folder can still be written, so /proc stands for a place nobody can write."""
    folder = tmp_path / "locked"
    folder.mkdir()
    folder.chmod(0o500)
    target = folder / "r.html" if os.geteuid() != 0 else Path("/proc/kcover-report.html")
    try:
        done = kcover("report", "--state-dir", str(recorded["state"]), "-o", str(target))
    finally:
        folder.chmod(0o700)
    assert done.returncode in (1, 2)
    assert "cannot write the report" in one_clean_line(done)
    assert not target.exists()
    assert leftovers(folder) == []


def test_a_full_disk_leaves_no_half_written_report(recorded: dict[str, Any]) -> None:
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full")
    done = kcover("report", "--state-dir", str(recorded["state"]), "-o", "/dev/full")
    assert done.returncode == 2
    assert "not a regular file" in one_clean_line(done)


def test_an_existing_report_is_replaced_whole(recorded: dict[str, Any], tmp_path: Path) -> None:
    target = tmp_path / "r.html"
    target.write_text("old")
    done = kcover("report", "--state-dir", str(recorded["state"]), "-o", str(target))
    assert done.returncode == 0, done.stderr
    assert target.read_text().startswith("<!DOCTYPE html>") and target.read_text().endswith("</html>\n")
    assert leftovers(tmp_path) == []


def test_a_damaged_database_is_an_error_that_names_it(tmp_path: Path) -> None:
    (tmp_path / "kcover.db").write_bytes(b"this is not sqlite" * 100)
    before = (tmp_path / "kcover.db").read_bytes()
    done = kcover("report", "--state-dir", str(tmp_path), "-o", str(tmp_path / "r.html"))
    assert done.returncode == 1
    assert "kcover.db" in one_clean_line(done)
    assert (tmp_path / "kcover.db").read_bytes() == before
    assert not (tmp_path / "r.html").exists()


def test_a_locked_database_is_waited_for_then_refused(recorded: dict[str, Any], tmp_path: Path) -> None:
    database = tmp_path / "kcover.db"
    database.write_bytes((recorded["state"] / "kcover.db").read_bytes())
    holder = sqlite3.connect(database, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        done = kcover("report", "--state-dir", str(tmp_path), "-o", str(tmp_path / "r.html"))
    finally:
        holder.close()
    assert done.returncode == 1
    assert "locked" in one_clean_line(done)


def test_a_run_and_a_kubernetes_job_together_is_a_usage_error(tmp_path: Path) -> None:
    done = kcover("report", "3", "--job", "team/train", "--state-dir", str(tmp_path))
    assert done.returncode == 2
    assert "give a run (3) or --job, not both" in one_clean_line(done)
    assert list(tmp_path.iterdir()) == []


def test_png_without_chromium_names_what_is_missing_and_keeps_the_html(recorded: dict[str, Any],
                                                                       tmp_path: Path) -> None:
    env = {**os.environ, "PATH": str(Path(sys.executable).parent)}
    import subprocess

    done = subprocess.run([sys.executable, "-m", "kcover", "report", "--state-dir", str(recorded["state"]), "-o",
                           str(tmp_path / "r.html"), "--png"], capture_output=True, text=True, env=env,
                          timeout=120, check=False)
    assert done.returncode == 1
    line = one_clean_line(done)
    assert "needs Chromium" in line and "apt-get install chromium" in line
    assert (tmp_path / "r.html").is_file()
    assert not (tmp_path / "r.png").exists()
