"""One run at a time per state dir, and a folder of its own for each run: real ``kcover run`` processes.

A second run on a busy state dir is refused (exit 2, the dir and the holder's pid
named, nothing started); the lock is the kernel's, so ``kill -9`` of the holder
frees it even while its orphaned workers live on; sequential runs never share a
log, so the evidence's file and line number point at the line that was classified.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

WORKERS = Path(__file__).parent / "workers"


def command(state: Path, script: str, *options: str) -> list[str]:
    return [sys.executable, "-m", "kcover", "run", "--json", "--quiet", "--state-dir", str(state),
            "--grace-period", "1", *options, "--", sys.executable, str(WORKERS / script)]


def run(state: Path, script: str, *options: str) -> tuple[int, dict[str, Any], str]:
    done = subprocess.run(command(state, script, *options), capture_output=True, text=True, timeout=120, check=False)
    return done.returncode, json.loads(done.stdout) if done.stdout.strip() else {}, done.stderr


def wait_for_logs(state: Path) -> list[Path]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        logs = list(state.glob("**/attempt-1/rank0.log"))
        if logs and logs[0].stat().st_size > 0:
            return logs
        time.sleep(0.05)
    raise AssertionError(f"no attempt-1/rank0.log under {state}")


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    """A live ``kcover run`` holding ``tmp_path/state``; stopped (with all its workers) at the end."""
    process = subprocess.Popen(command(tmp_path / "state", "steps_forever.py", "--nproc-per-node", "2"),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_logs(tmp_path / "state")
        yield process
    finally:
        workers = _descendants(process.pid)
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        process.communicate(timeout=30)
        for worker in workers:
            with contextlib.suppress(psutil.Error):
                worker.kill()


def _descendants(pid: int) -> list[psutil.Process]:
    with contextlib.suppress(psutil.Error):
        return list(psutil.Process(pid).children(recursive=True))
    return []


def test_second_run_on_a_busy_state_dir_is_refused_and_starts_nothing(
        tmp_path: Path, holder: subprocess.Popen[str]) -> None:
    state = tmp_path / "state"
    folders = sorted(state.glob("runs/*"))
    code, document, stderr = run(state, "ok.py")
    assert code == 2
    assert f"state dir {state} is in use by another kcover run (pid {holder.pid} on {socket.gethostname()})" in stderr
    assert "Traceback" not in stderr
    assert "attempts" not in document  # a usage error: no attempt, at most an error document
    assert sorted(state.glob("runs/*")) == folders
    assert len(sqlite3.connect(state / "kcover.db").execute("SELECT id FROM runs").fetchall()) == 1
    assert holder.poll() is None  # the first run goes on undisturbed


def test_demo_never_wipes_a_state_dir_a_run_holds(tmp_path: Path, holder: subprocess.Popen[str]) -> None:
    state = tmp_path / "state"
    logs = sorted(state.glob("runs/*/attempt-1/rank0.log"))
    done = subprocess.run([sys.executable, "-m", "kcover", "demo", "--state-dir", str(state)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2
    busy = f"state dir {state} is in use by another kcover run (pid {holder.pid} on {socket.gethostname()})"
    assert busy in done.stderr
    assert sorted(state.glob("runs/*/attempt-1/rank0.log")) == logs  # before: the demo deleted them
    assert (state / "kcover.db").is_file()
    assert holder.poll() is None


def test_kill_9_of_the_holder_leaves_no_stale_lock_even_with_its_workers_alive(
        tmp_path: Path, holder: subprocess.Popen[str]) -> None:
    state = tmp_path / "state"
    orphans = _descendants(holder.pid)
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=30)
    try:
        code, document, stderr = run(state, "ok.py")
    finally:
        for orphan in orphans:
            with contextlib.suppress(psutil.Error):
                orphan.kill()
    assert code == 0, stderr[-2000:]
    assert document["status"] == "succeeded"


def test_sequential_runs_get_their_own_folders_and_exact_evidence(tmp_path: Path) -> None:
    state = tmp_path / "state"
    documents = [run(state, "keyerror.py", "--nproc-per-node", "2", "--user-code-retries", "0")[1]
                 for _ in range(2)]
    run_dirs = [Path(d["run_dir"]) for d in documents]
    assert run_dirs[0] != run_dirs[1]
    assert all(d.parent == (state / "runs").resolve() for d in run_dirs)
    for document, run_dir in zip(documents, run_dirs, strict=True):
        log = (run_dir / "attempt-1" / "rank0.log").read_text().splitlines()
        assert sum("step 0" in line for line in log) == 1  # only this run's lines
        evidence = next(f["evidence"] for f in document["faults"] if f["rank"] == 0 and f["category"] == "user_code")
        assert evidence["source"] == str(run_dir / "attempt-1" / "rank0.log")
        assert evidence["line"] in Path(evidence["source"]).read_text().splitlines()[evidence["line_number"] - 1]
    stored = sqlite3.connect(state / "kcover.db").execute("SELECT source FROM faults WHERE rank = 0").fetchall()
    assert {Path(source).parent.parent for (source,) in stored if source.endswith(".log")} == set(run_dirs)


def test_a_crlf_split_across_two_reads_keeps_evidence_line_numbers_exact(tmp_path: Path) -> None:
    _, document, stderr = run(tmp_path / "state", "split_crlf.py", "--user-code-retries", "0")
    evidence = next(f["evidence"] for f in document["faults"] if f["category"] == "user_code")
    assert evidence["line_number"] == 4, stderr[-2000:]  # before: 7, each split \r\n counted twice
    assert Path(evidence["source"]).read_bytes().split(b"\n")[3].startswith(b"KeyError")


@pytest.mark.parametrize("blocker", ["fifo", "symlink", "folder"])
def test_a_lock_file_that_is_not_a_file_is_a_usage_error(tmp_path: Path, blocker: str) -> None:
    state = tmp_path / "state"
    state.mkdir()
    lock = state / "kcover.lock"
    if blocker == "fifo":
        os.mkfifo(lock)
    elif blocker == "symlink":
        lock.symlink_to(tmp_path / "elsewhere")
    else:
        lock.mkdir()
    code, _, stderr = run(state, "ok.py")
    assert code == 2
    assert f"state dir {state}" in stderr and "kcover.lock" in stderr
    assert "Traceback" not in stderr
    assert not (state / "runs").exists()
    assert not (tmp_path / "elsewhere").exists()


def test_runs_that_is_a_file_is_a_usage_error(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "runs").write_text("not a folder")
    code, _, stderr = run(state, "ok.py")
    assert code == 2
    assert f"state dir {state} is not writable" in stderr and "runs" in stderr
    assert "Traceback" not in stderr
