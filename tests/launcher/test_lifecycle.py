"""Process lifecycle of ``kcover run``: nothing it started outlives it, however it ends.

Real launchers, real workers, real signals: ``kill -9`` and SIGHUP to kcover,
workers that leave background children or setsid'ed daemons behind after a
successful exit, and workers that make hundreds of short-lived orphans.  The
suite-wide fixture in ``tests/conftest.py`` also fails a test that leaves any
process of this session running.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

WORKERS = Path(__file__).parent / "workers"
PATIENCE = 60.0


def wait_for(condition: Callable[[], bool], what: str, patience: float = PATIENCE) -> None:
    """Wait (generously) until ``condition`` holds; fail naming ``what`` if it never does."""
    deadline = time.monotonic() + patience
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting: {what}"
        time.sleep(0.05)


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def launch(tmp_path: Path, script: str, *options: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir(exist_ok=True)
    command = [sys.executable, "-m", "kcover", "run", "--json", "--quiet", "--state-dir", str(tmp_path / "state"),
               "--grace-period", "2", "--max-restarts", "0", *options, "--", sys.executable, str(WORKERS / script)]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PID_DIR": str(pid_dir), **(env or {})})


def worker_pids(tmp_path: Path, ranks: int) -> list[int]:
    """The pids each rank wrote to ``pids/rankR.pids`` (waits until every rank did)."""
    files = [tmp_path / "pids" / f"rank{rank}.pids" for rank in range(ranks)]
    wait_for(lambda: all(f.exists() for f in files), "every worker wrote its pids")
    return [int(pid) for f in files for pid in f.read_text().split()]


def history(tmp_path: Path) -> list[dict[str, Any]]:
    done = subprocess.run([sys.executable, "-m", "kcover", "history", "--json", "--state-dir",
                           str(tmp_path / "state")], capture_output=True, text=True, check=True, timeout=60)
    runs: list[dict[str, Any]] = json.loads(done.stdout)
    return runs


def test_kill_9_of_kcover_takes_its_workers_and_their_children_along(tmp_path: Path) -> None:
    launcher = launch(tmp_path, "sleeper.py", "--nproc-per-node", "2", env={"CHILDREN": "1"})
    pids = worker_pids(tmp_path, 2)
    launcher.kill()
    launcher.communicate(timeout=30)
    for pid in pids:
        wait_for(functools.partial(gone, pid), f"process {pid} to die with its killed launcher")
    assert [run["status"] for run in history(tmp_path)] == ["lost"]


def test_sighup_to_kcover_is_handled_like_sigterm(tmp_path: Path) -> None:
    launcher = launch(tmp_path, "sleeper.py", "--nproc-per-node", "2")
    pids = worker_pids(tmp_path, 2)
    launcher.send_signal(signal.SIGHUP)
    out, _ = launcher.communicate(timeout=60)
    assert launcher.returncode == 130
    assert json.loads(out)["status"] == "interrupted"
    assert all(gone(pid) for pid in pids)
    runs = history(tmp_path)
    assert [(run["status"], run["reason"]) for run in runs] == [("interrupted", "kcover received SIGHUP")]


def test_a_live_launcher_is_not_lost(tmp_path: Path) -> None:
    launcher = launch(tmp_path, "sleeper.py")
    worker_pids(tmp_path, 1)
    try:
        assert [run["status"] for run in history(tmp_path)] == ["running"]
    finally:
        launcher.terminate()
        launcher.communicate(timeout=60)
    assert launcher.returncode == 130


def test_leftovers_of_a_successful_run_are_stopped(tmp_path: Path) -> None:
    launcher = launch(tmp_path, "leftovers.py", "--nproc-per-node", "2")
    out, err = launcher.communicate(timeout=120)
    assert launcher.returncode == 0, err[-2000:]
    assert json.loads(out)["status"] == "succeeded"
    pids = worker_pids(tmp_path, 2)
    assert all(gone(pid) for pid in pids), [psutil.Process(p).cmdline() for p in pids if not gone(p)]


def test_adopted_orphans_are_reaped_while_the_run_goes_on(tmp_path: Path) -> None:
    launcher = launch(tmp_path, "zombies.py", env={"COUNT": "300"})
    try:
        wait_for((tmp_path / "pids" / "forked").exists, "the worker forked its 300 children")

        def zombies() -> list[psutil.Process]:
            children = psutil.Process(launcher.pid).children()
            return [c for c in children if gone(c.pid)]

        wait_for(lambda: not zombies(), "kcover to reap its adopted zombies while the worker still runs")
        assert launcher.poll() is None
    finally:
        (tmp_path / "pids" / "done").write_text("")
        out, err = launcher.communicate(timeout=120)
    assert launcher.returncode == 0, err[-2000:]
    assert json.loads(out)["status"] == "succeeded"


def test_workers_die_with_kcover_even_without_the_guardian(tmp_path: Path) -> None:
    launcher = launch(tmp_path, "sleeper.py", "--nproc-per-node", "2")
    pids = worker_pids(tmp_path, 2)
    guardians = [c for c in psutil.Process(launcher.pid).children() if "guardian.py" in " ".join(c.cmdline())]
    assert len(guardians) == 1
    guardians[0].kill()
    wait_for(functools.partial(gone, guardians[0].pid), "the guardian to die")
    launcher.kill()
    launcher.communicate(timeout=30)
    for pid in pids:
        wait_for(functools.partial(gone, pid), f"worker {pid} to die with its killed launcher (PR_SET_PDEATHSIG)")


ORPHANED_BEFORE_EXEC = """
import os, subprocess, sys
from kcover.launcher.workers import die_with_launcher
arm = die_with_launcher()  # armed for this process as the launcher...
child = os.fork()
if child == 0:  # ...but started from another process: as if the launcher died before prctl took effect
    started = subprocess.Popen(["true"], preexec_fn=arm)
    os._exit(0 if started.wait() == -9 else 1)
_, status = os.waitpid(child, 0)
sys.exit(os.waitstatus_to_exitcode(status))
"""


def test_a_worker_whose_launcher_died_before_prctl_kills_itself_before_exec() -> None:
    done = subprocess.run([sys.executable, "-c", ORPHANED_BEFORE_EXEC], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr


def test_no_parent_death_signal_is_armed_from_a_thread_that_may_end_first() -> None:
    from kcover.launcher.workers import die_with_launcher

    armed: list[object] = []
    thread = threading.Thread(target=lambda: armed.append(die_with_launcher()))
    thread.start()
    thread.join()
    assert armed == [None]
    assert die_with_launcher() is not None


def test_the_reaper_never_takes_a_workers_exit_status(tmp_path: Path) -> None:
    launcher = launch(tmp_path, "zombies.py", "--nproc-per-node", "3",
                      env={"COUNT": "100", "NO_WAIT": "1", "EXIT_CODE": "3"})
    out, err = launcher.communicate(timeout=120)
    assert launcher.returncode == 1, err[-2000:]
    assert json.loads(out)["status"] == "failed"
    assert "exited with 3" in err
