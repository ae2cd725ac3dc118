"""A state dir that fills up mid-run: a real 1 MiB tmpfs, real workers, the real ``kcover run``.

Writing the rank logs fails with ENOSPC part-way; kcover must say so once, keep
classifying and tracking progress, keep the workers supervised (stopped at the
end, never orphaned) and still print its ``--json`` document.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

WORKERS = Path(__file__).parent / "workers"


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs mounted for the test (we run as root); skipped where mounting is impossible."""
    mount_point = tmp_path / "state"
    mount_point.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount_point)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def run_on(state: Path, pids: Path, then: str, *options: str) -> tuple[int, dict[str, Any], str]:
    pids.mkdir()
    command = [sys.executable, "-m", "kcover", "run", "--json", "--quiet", "--state-dir", str(state),
               "--grace-period", "2", "--nproc-per-node", "2", *options, "--",
               sys.executable, str(WORKERS / "fill_disk.py")]
    env = {**os.environ, "PID_DIR": str(pids), "THEN": then}
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False, env=env)
    document = json.loads(done.stdout) if done.stdout.strip() else {}
    return done.returncode, document, done.stderr


def alive(pids: Path) -> list[int]:
    found = [int(p.read_text()) for p in pids.glob("rank*.pid")]
    return [pid for pid in found if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]


def test_full_state_dir_is_reported_once_and_the_job_still_succeeds(small_disk: Path, tmp_path: Path) -> None:
    code, document, stderr = run_on(small_disk, tmp_path / "pids", "exit")
    assert "Traceback" not in stderr, stderr[-3000:]
    assert code == 0, stderr[-3000:]
    assert document["status"] == "succeeded"
    assert document["attempts"][0]["max_step"] == 7  # progress read after the disk was full
    assert stderr.count("No space left on device") == 1, stderr[-3000:]
    assert alive(tmp_path / "pids") == []


def test_full_state_dir_still_classifies_and_stops_the_workers(small_disk: Path, tmp_path: Path) -> None:
    code, document, stderr = run_on(small_disk, tmp_path / "pids", "xid", "--max-restarts", "0")
    assert "Traceback" not in stderr, stderr[-3000:]
    assert code == 1, stderr[-3000:]
    assert document["status"] == "failed"
    assert document["root_cause"]["category"] == "gpu_hardware"
    assert document["root_cause"]["rank"] == 0
    assert document["attempts"][0]["max_step"] == 7
    assert alive(tmp_path / "pids") == []


def test_a_closed_stderr_turns_the_echo_off_and_the_job_goes_on(tmp_path: Path) -> None:
    """``kcover run … 2>&1 | head -1``: the echo hits a broken pipe; the run must not die of it."""
    command = [sys.executable, "-m", "kcover", "run", "--json", "--state-dir", str(tmp_path / "state"),
               "--nproc-per-node", "2", "--", sys.executable, str(WORKERS / "steps_forever.py")]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "STEPS_SECONDS": "2"})
    assert process.stderr is not None
    assert "start: attempt 1" in process.stderr.readline()
    process.stderr.close()
    out, _ = process.communicate(timeout=120)
    assert process.returncode == 0
    document = json.loads(out)
    assert document["status"] == "succeeded"
    assert document["attempts"][0]["max_step"] >= 10  # progress kept coming after the echo broke
