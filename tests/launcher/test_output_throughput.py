"""Reading a chatty rank: a full pipe is drained in one wake-up (bounded), so the writer is not held in ``write()``.

The old pump read one 64 KiB chunk per stream per 25 ms round, capping a rank at
about 2.6 MB/s.  These tests look at what one wake-up does with a real worker's
full pipe — no timing: the pipe is enlarged, drained in one call up to the
per-stream budget, and never read past that budget (so one chatty rank cannot
starve the others or the supervision loop).  End to end, a rank flooding its
pipe neither hides another rank's fault nor delays a stop request.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kcover.classify.collector import FaultCollector
from kcover.classify.matcher import default_matcher
from kcover.launcher.output import OutputPump
from kcover.launcher.workers import Worker, WorkerGroup, WorkerSpec, start_worker

WORKERS = Path(__file__).parent / "workers"
LINE = 64
MIB = 1 << 20


@pytest.fixture
def flooding(tmp_path: Path) -> Iterator[tuple[OutputPump, Worker]]:
    """A real worker that wrote 4 MiB into its stdout and waits; its pipe is full when the fixture yields."""
    spec = WorkerSpec(0, 0, "node-0", 0, (sys.executable, str(WORKERS / "flood.py")), dict(os.environ))
    worker = start_worker(spec)
    pump = OutputPump(default_matcher(), FaultCollector(), tmp_path)
    try:
        pump.add(worker)
        assert worker.process.stdout is not None
        wait_until_full(worker.process.stdout.fileno())
        yield pump, worker
    finally:
        WorkerGroup([worker]).stop(0)
        pump.close()
        WorkerGroup([worker]).close()


def wait_until_full(fd: int) -> None:
    capacity = fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ)
    deadline = time.monotonic() + 60
    while pending(fd) < capacity:
        assert time.monotonic() < deadline, "the worker never filled its pipe"
        time.sleep(0.01)


def pending(fd: int) -> int:
    return int(struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0" * 4))[0])


def test_a_chatty_ranks_pipe_is_enlarged(flooding: tuple[OutputPump, Worker]) -> None:
    _, worker = flooding
    assert worker.process.stdout is not None
    assert fcntl.fcntl(worker.process.stdout.fileno(), fcntl.F_GETPIPE_SZ) >= MIB


def test_one_wake_up_drains_a_full_pipe_up_to_its_budget(flooding: tuple[OutputPump, Worker]) -> None:
    pump, worker = flooding
    assert worker.process.stdout is not None
    pump.pump(5.0)
    assert pump.logs[0].lines * LINE == MIB  # all of the full 1 MiB pipe: not one 64 KiB chunk, not more
    assert pump.busy  # the loop is told to come back at once
    wait_until_full(worker.process.stdout.fileno())  # the writer, unblocked, refills it
    pump.pump(5.0)
    assert pump.logs[0].lines * LINE == 2 * MIB  # the next wake-up takes the next budget's worth


def kcover(tmp_path: Path, *options: str, fault: bool) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "kcover", "run", "--json", "--quiet", "--state-dir", str(tmp_path / "state"),
               "--grace-period", "1", "--max-restarts", "0", "--nproc-per-node", "2", *options, "--",
               sys.executable, str(WORKERS / "flood_and_fault.py")]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "FAULT": "1" if fault else "0"})


def test_a_flooding_rank_does_not_hide_another_ranks_fault(tmp_path: Path) -> None:
    process = kcover(tmp_path, fault=True)
    out, err = process.communicate(timeout=120)
    document = json.loads(out)
    assert process.returncode == 1, err[-2000:]
    assert document["root_cause"]["rank"] == 1
    assert document["root_cause"]["category"] == "gpu_hardware"


def test_a_flooding_rank_does_not_delay_a_stop_request(tmp_path: Path) -> None:
    process = kcover(tmp_path, fault=False)
    deadline = time.monotonic() + 60
    while not any("step 3" in log.read_text() for log in (tmp_path / "state").glob("runs/*/attempt-1/rank1.log")):
        assert time.monotonic() < deadline, "rank 1 never reported its step"
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 130, err[-2000:]
    assert json.loads(out)["attempts"][0]["max_step"] == 3
