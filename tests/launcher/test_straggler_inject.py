"""``--inject slow@…``: the spec, and the SIGSTOP/SIGCONT throttle on real processes (never left stopped)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from kcover.launcher.inject import InjectError, InjectKind, parse_injections
from kcover.launcher.throttle import Throttle

WORKERS = Path(__file__).parent / "workers"
CHUNKS = textwrap.dedent("""
    import sys, time
    began = time.perf_counter()
    for _ in range(int(sys.argv[1])):
        time.sleep(0.001)
    print(time.perf_counter() - began, flush=True)
""")


@pytest.mark.parametrize(("spec", "factor", "when", "value"), [
    ("slow@rank3:factor=1.3", 1.3, "after", 0.0),
    ("slow@node-1:factor=2:step=20", 2.0, "step", 20.0),
    ("slow@rank0:after=1.5:factor=100", 100.0, "after", 1.5),
])
def test_a_slow_spec_names_its_factor(spec: str, factor: float, when: str, value: float) -> None:
    [injection] = parse_injections(spec)
    assert (injection.kind, injection.factor, injection.when, injection.value) == (InjectKind.SLOW, factor, when,
                                                                                   value)


@pytest.mark.parametrize(("spec", "says"), [
    ("slow@rank3", "slow needs factor=F"),
    ("slow@rank3:factor=0", "greater than 1"),
    ("slow@rank3:factor=-1", "greater than 1"),
    ("slow@rank3:factor=1", "greater than 1"),
    ("slow@rank3:factor=nan", "(got 'nan')"),
    ("slow@rank3:factor=inf", "(got 'inf')"),
    ("slow@rank3:factor=1e999", "(got '1e999')"),
    ("slow@rank3:factor=101", "at most 100"),
    ("slow@rank3:factor=", "(got '')"),
    ("slow@rank3:factor=fast", "(got 'fast')"),
    ("crash@rank3:factor=2", "only for slow"),
    ("slow@rank3:factor=2:factor=3", "expected KIND@TARGET"),
    ("slow@rank3:step=2:after=3:factor=2", "expected KIND@TARGET"),
    ("slow@rank3:speed=2", "expected KIND@TARGET"),
    ("slow@rank3:step=-2:factor=2", "step must be a number"),
    ("slow@rank3:step=nan:factor=2", "step must be a number"),
])
def test_a_bad_slow_spec_is_one_clear_error(spec: str, says: str) -> None:
    with pytest.raises(InjectError, match=None) as caught:
        parse_injections(spec)
    assert says in str(caught.value) and spec in str(caught.value)


def chunked(chunks: int) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", CHUNKS, str(chunks)], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)


def elapsed(process: subprocess.Popen[str]) -> float:
    out, _ = process.communicate(timeout=60)
    return float(out)


def test_a_throttled_process_runs_factor_times_slower() -> None:
    plain = elapsed(chunked(300))
    process = chunked(300)
    throttle = Throttle(process.pid, 2.0).start()
    try:
        slow = elapsed(process)
    finally:
        throttle.stop()
    assert 1.5 < slow / plain < 3.0, (plain, slow)


def test_stop_always_leaves_the_process_running() -> None:
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        for pause in (0.0, 0.003, 0.007, 0.011, 0.017, 0.023, 0.031, 0.043):
            throttle = Throttle(process.pid, 10.0).start()  # stopped 90% of the time
            time.sleep(pause)
            throttle.stop()
            assert not throttle.running
            assert psutil.Process(process.pid).status() != psutil.STATUS_STOPPED
    finally:
        process.kill()
        process.wait()


def test_a_rank_that_dies_while_throttled_ends_the_throttle() -> None:
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    throttle = Throttle(process.pid, 5.0).start()
    time.sleep(0.1)
    process.kill()
    process.wait()
    deadline = time.monotonic() + 5
    while throttle.running and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not throttle.running
    throttle.stop()  # safe on a gone group


def test_the_whole_process_group_is_throttled_and_released() -> None:
    code = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); " \
           "time.sleep(60)"
    process = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while not psutil.Process(process.pid).children() and time.monotonic() < deadline:
            time.sleep(0.02)
        [child] = psutil.Process(process.pid).children()
        throttle = Throttle(process.pid, 100.0).start()
        time.sleep(0.05)
        assert child.status() == psutil.STATUS_STOPPED
        throttle.stop()
        assert child.status() != psutil.STATUS_STOPPED
    finally:
        for pid in (child.pid, process.pid):
            psutil.Process(pid).kill()
        process.wait()
        child.wait(5)


def kcover_run(tmp_path: Path, *options: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "kcover", "run", "--json", "--quiet", "--state-dir", str(tmp_path / "state"),
               *options, "--", sys.executable, str(WORKERS / "ok.py")]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.parametrize(("options", "says"), [
    (("--inject", "slow@rank0:factor=0"), "slow@rank0:factor=0"),
    (("--inject", "slow@rank0:factor=-1"), "slow@rank0:factor=-1"),
    (("--inject", "slow@rank0:factor=nan"), "slow@rank0:factor=nan"),
    (("--inject", "slow@rank0"), "slow@rank0"), (("--inject", "slow@rank5:factor=2"), "rank5"),
    (("--straggler-action", "kick"), "--straggler-action"),
    (("--total-steps", "0"), "--total-steps"), (("--total-steps", "-3"), "--total-steps"),
])
def test_bad_straggler_options_are_usage_errors(tmp_path: Path, options: tuple[str, ...], says: str) -> None:
    done = kcover_run(tmp_path, *options)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("kcover: ") and says in line, line
    assert json.loads(done.stdout) == {"status": "usage_error", "error": line.removeprefix("kcover: ")}
    assert not (tmp_path / "state" / "runs").exists()


def throttled_sleepers(tmp_path: Path) -> tuple[subprocess.Popen[str], list[int]]:
    """``kcover run`` of 2 sleeping ranks (each with a child), rank 1 throttled 20x; kcover and rank 1's pids."""
    command = [sys.executable, "-m", "kcover", "run", "--json", "--quiet", "--state-dir", str(tmp_path / "state"),
               "--grace-period", "2", "--nproc-per-node", "2", "--inject", "slow@rank1:factor=20", "--",
               sys.executable, str(WORKERS / "sleeper.py")]
    env = {**os.environ, "PID_DIR": str(tmp_path), "CHILDREN": "1"}
    kcover = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    pids_file = tmp_path / "rank1.pids"
    deadline = time.monotonic() + 60
    while not pids_file.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    worker, child, _daemon = (int(p) for p in pids_file.read_text().split())
    statuses = set()
    for _ in range(50):
        statuses |= {psutil.Process(pid).status() for pid in (worker, child)}
        time.sleep(0.01)
    assert psutil.STATUS_STOPPED in statuses  # the throttle holds rank 1 and its child stopped 95% of the time
    return kcover, [worker, child]


def dead(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def gone(pids: list[int], within: float) -> bool:
    deadline = time.monotonic() + within
    while not all(dead(pid) for pid in pids):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def test_sigterm_to_kcover_while_a_rank_is_throttled_leaves_nothing_stopped(tmp_path: Path) -> None:
    kcover, pids = throttled_sleepers(tmp_path)
    kcover.send_signal(signal.SIGTERM)
    out, _ = kcover.communicate(timeout=60)
    assert kcover.returncode == 130
    assert json.loads(out)["status"] == "interrupted"
    assert gone(pids, 0.0)


def test_kill_9_of_kcover_while_a_rank_is_throttled_leaves_nothing_stopped(tmp_path: Path) -> None:
    """No throttle survives kcover: the kernel's SIGKILL and the guardian reach stopped processes too."""
    kcover, pids = throttled_sleepers(tmp_path)
    kcover.kill()
    kcover.communicate(timeout=60)
    assert gone(pids, 20.0)
