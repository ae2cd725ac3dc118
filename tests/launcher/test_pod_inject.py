"""``kcover pod``'s side of ``kcover inject``: the order file, read without blocking, and its orders on real workers."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from kcover.classify.matcher import default_matcher
from kcover.launcher.inject import InjectKind
from kcover.launcher.pod_inject import MAX_ORDER, Order, OrderFile, apply, parse_order, read_order
from kcover.launcher.workers import Worker, WorkerGroup, WorkerSpec, start_worker

SLEEPER = Path(__file__).parent / "workers" / "sleeper.py"
UID = "0b5a7c2e-3f11-4f5e-9d59-2c6f1e8a9b10"


@pytest.mark.parametrize(("text", "expected"), [
    (f"crash@rank1#{UID}", Order(InjectKind.CRASH, 1, UID)),
    ("hang@rank0#abc\n", Order(InjectKind.HANG, 0, "abc")),
    ("oom@rank12#x-1", Order(InjectKind.OOM, 12, "x-1")),
], ids=["crash", "hang-newline", "oom"])
def test_well_formed_orders_are_read(text: str, expected: Order) -> None:
    assert parse_order(text) == expected
    assert parse_order(expected.text()) == expected


@pytest.mark.parametrize("text", [
    "", "crash", "crash@rank1", "xid79@rank1#a", "slow@rank1#a", "crash@node-1#a", "crash@rank1#", "crash@rank1#a b",
    "crash@rank-1#a", "crash@rank12345678#a", "crash@rank1#a\ncrash@rank2#b", "CRASH@rank1#a",
    "crash@rank1#" + "a" * 65,
], ids=lambda text: repr(text[:20]))
def test_anything_else_is_no_order(text: str) -> None:
    assert parse_order(text) is None


def test_the_file_is_read_without_blocking_whatever_stands_there(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    garbage = tmp_path / "garbage"
    garbage.write_bytes(os.urandom(1 << 20))
    long = tmp_path / "long"
    long.write_text("crash@rank1#a" + " " * MAX_ORDER)
    began = time.monotonic()
    for path in (fifo, tmp_path, garbage, long, tmp_path / "missing", Path("/dev/zero"), None):
        assert read_order(path) is None
    assert time.monotonic() - began < 1.0


def test_each_order_acts_once_and_one_there_at_start_never(tmp_path: Path) -> None:
    path = tmp_path / "inject"
    path.write_text("crash@rank0#old")
    orders = OrderFile.beside(tmp_path / "generation")
    assert orders.path == path
    assert orders.new() == []  # written before this kcover pod started: an old order
    path.write_text("hang@rank0#new1")
    assert orders.new() == [Order(InjectKind.HANG, 0, "new1")]
    assert orders.new() == []
    path.write_text("not an order")
    assert orders.new() == []
    path.write_text("crash@rank0#new2")
    assert orders.new() == [Order(InjectKind.CRASH, 0, "new2")]
    path.write_text("hang@rank0#new1")  # an id already handled
    assert orders.new() == []
    assert OrderFile.beside(None).new() == []


@pytest.fixture
def group(tmp_path: Path) -> Iterator[WorkerGroup]:
    """Two sleeping workers of pod rank 1 (ranks 2 and 3)."""
    workers = WorkerGroup([])
    for local in range(2):
        env = {**os.environ, "RANK": str(2 + local), "PID_DIR": str(tmp_path)}
        workers.workers.append(start_worker(WorkerSpec(2 + local, local, "node-a", 1, (sys.executable, str(SLEEPER)),
                                                       env), capture_output=False))
    for local in range(2):
        deadline = time.monotonic() + 20
        while not (tmp_path / f"rank{2 + local}.pids").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
    yield workers
    # Not workers.stop(): in a launcher it stops every child of the process, and here that is pytest's
    # (the session's test cluster included). Each worker's own process group is enough.
    for worker in workers.workers:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(worker.pid, signal.SIGKILL)
        worker.process.wait(timeout=10)
        with contextlib.suppress(OSError):
            os.close(worker.progress_read)


def ended(group: WorkerGroup, worker: Worker) -> int:
    """The worker's exit status, waited for on its own (``group.poll`` would reap other children of pytest)."""
    deadline = time.monotonic() + 10
    while worker.process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert worker.process.returncode is not None
    worker.exit_code = worker.process.returncode
    return worker.exit_code


def test_crash_kills_the_pods_first_worker(group: WorkerGroup) -> None:
    said: list[str] = []
    hit = apply(Order(InjectKind.CRASH, 1, "a"), group.workers, said.append)
    assert hit is group.workers[0]
    assert ended(group, hit) == -signal.SIGKILL
    assert said == [] and group.workers[1].exit_code is None
    again = apply(Order(InjectKind.CRASH, 1, "b"), group.workers, said.append)  # the next running worker
    assert again is group.workers[1] and ended(group, again) == -signal.SIGKILL


def test_hang_freezes_the_worker(group: WorkerGroup) -> None:
    hit = apply(Order(InjectKind.HANG, 1, "a"), group.workers)
    assert hit is not None
    deadline = time.monotonic() + 5
    while psutil.Process(hit.pid).status() != psutil.STATUS_STOPPED and time.monotonic() < deadline:
        time.sleep(0.02)
    assert psutil.Process(hit.pid).status() == psutil.STATUS_STOPPED
    assert psutil.Process(group.workers[1].pid).status() != psutil.STATUS_STOPPED
    group.poll()
    assert hit.exit_code is None


def test_oom_says_the_kernel_line_the_catalog_calls_an_oom_then_kills(group: WorkerGroup) -> None:
    said: list[str] = []
    hit = apply(Order(InjectKind.OOM, 1, "a"), group.workers, said.append)
    assert hit is not None and ended(group, hit) == -signal.SIGKILL
    assert len(said) == 1 and f"Killed process {hit.pid} (python)" in said[0]
    rule = default_matcher().classify_text(said[0])
    assert rule is not None and rule.id == "host.oom-killer"


def test_an_order_for_another_pod_rank_touches_nothing(group: WorkerGroup, capsys: pytest.CaptureFixture[str]) -> None:
    assert apply(Order(InjectKind.CRASH, 0, "a"), group.workers) is None
    assert "no running worker of pod rank 0" in capsys.readouterr().err
    assert all(w.process.poll() is None for w in group.workers)


def test_reading_a_fifo_never_waits_for_a_writer(tmp_path: Path) -> None:
    fifo = tmp_path / "inject"
    os.mkfifo(fifo)
    result: list[object] = []
    reader = threading.Thread(target=lambda: result.append(OrderFile(fifo).new()), daemon=True)
    reader.start()
    reader.join(2)
    assert result == [[]]
