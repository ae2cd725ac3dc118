"""Stragglers in ``kcover run``: real gloo workers timed through the SDK, a real SIGSTOP/SIGCONT throttle."""

from __future__ import annotations

import math
import os
import sqlite3
from pathlib import Path

import pytest
from tests.launcher.test_run import run

from kcover import sdk
from kcover.launcher.output import ProgressSeen, TimingSeen, _progress_events
from kcover.runreport.load import load_run

TRAIN = "straggler_train.py"


def stragglers_in_db(state: Path) -> list[tuple[object, ...]]:
    with sqlite3.connect(state / "kcover.db") as db:
        return db.execute("SELECT attempt, rank, node, action, slowdown FROM stragglers").fetchall()


def test_a_throttled_rank_is_found_and_the_uneven_rank_is_not(tmp_path: Path) -> None:
    """Rank 0 does 30% extra work every 10th step by design; rank 2 is throttled 1.5x from step 30."""
    code, doc, stderr = run(tmp_path, TRAIN, "--nnodes", "3", "--inject", "slow@rank2:factor=1.5:step=30")
    assert code == 0, stderr[-3000:]
    [straggler] = doc["stragglers"]
    assert (straggler["attempt"], straggler["rank"], straggler["node"], straggler["action"]) == (1, 2, "node-2",
                                                                                               "reported")
    assert 1.2 < straggler["slowdown"] < 2.0
    assert 30 < straggler["since_step"] < 30 + 30
    assert "is a straggler" in stderr
    [(attempt, rank, node, action, slowdown)] = stragglers_in_db(tmp_path / "state")
    assert (attempt, rank, node, action) == (1, 2, "node-2", "reported")
    assert slowdown == pytest.approx(straggler["slowdown"], abs=0.001)
    [shown] = load_run(tmp_path / "state" / "kcover.db", None).stragglers
    assert (shown.rank, shown.node) == (2, "node-2") and "is a straggler" in shown.detail


def test_replace_restarts_on_the_spare_node_when_it_pays(tmp_path: Path) -> None:
    """``--total-steps`` claims a long job so that the gain wins even when a loaded machine makes the measured
    restart cost long (the weighing itself is tested in tests/decide); the job itself stops at step 300."""
    code, doc, stderr = run(tmp_path, TRAIN, "--nnodes", "2", "--spare-nodes", "1", "--straggler-action", "replace",
                            "--total-steps", "100000", "--inject", "slow@rank1:factor=3:step=30",
                            env={"STEPS": "300"})
    assert code == 0, stderr[-3000:]
    assert doc["restarts"] == 1 and doc["excluded_nodes"] == ["node-1"], stderr[-3000:]
    first, second = doc["attempts"]
    assert first["outcome"] == "straggler" and first["root_cause"]["rule"] == "job.straggler"
    assert first["root_cause"]["nodes"] == ["node-1"]
    assert second["nodes"] == ["node-0", "node-2"] and second["outcome"] == "succeeded"
    # Attempt 2 runs with no spare left: on a loaded 2-core machine a rank there may be reported slow
    # (8% is the detector's floor), never replaced; attempt 1's one straggler is the injected rank.
    [straggler] = [found for found in doc["stragglers"] if found["attempt"] == 1]
    assert straggler["action"] == "replaced" and "gain" in straggler["detail"]
    assert all(found["action"] == "reported" for found in doc["stragglers"] if found["attempt"] == 2)
    rows = [row[:4] for row in stragglers_in_db(tmp_path / "state")]
    assert [row for row in rows if row[0] == 1] == [(1, 1, "node-1", "replaced")]
    assert all(row[3] == "reported" for row in rows if row[0] == 2)


def test_replace_without_a_spare_only_reports(tmp_path: Path) -> None:
    code, doc, stderr = run(tmp_path, TRAIN, "--nnodes", "2", "--straggler-action", "replace", "--total-steps",
                            "120", "--inject", "slow@rank1:factor=2:step=30")
    assert code == 0, stderr[-3000:]
    assert doc["restarts"] == 0
    [straggler] = doc["stragglers"]
    assert straggler["action"] == "reported" and "no spare node" in straggler["detail"]


def test_a_rank_that_dies_while_throttled_fails_cleanly(tmp_path: Path) -> None:
    """Nothing is left stopped or running (the suite's leak check), and the failure is the rank's exit."""
    code, doc, stderr = run(tmp_path, TRAIN, "--nnodes", "2", "--max-restarts", "0", "--inject",
                            "slow@rank1:factor=4:step=5", env={"DIE_RANK": "1", "DIE_STEP": "20"})
    assert code == 1, stderr[-3000:]
    assert doc["status"] == "failed"
    assert "rank 1 (node-1) exited with 3" in stderr


def test_timings_travel_on_the_progress_pipe() -> None:
    read, write = os.pipe()
    os.environ[sdk._FD_VARIABLE] = str(write)
    try:
        sdk.step_time(0.25, step=7)
        sdk.step_time(math.nan, step=8)  # not sent
        sdk.step_time(-1.0)  # not sent
        with sdk.timed(9):
            pass
        sdk.progress(9)
    finally:
        del os.environ[sdk._FD_VARIABLE]
        os.close(write)
    data = os.read(read, 4096)
    os.close(read)
    events = list(_progress_events(0, data, 1.0))
    assert events[0] == TimingSeen(0, 7, 0.25)
    assert isinstance(events[1], TimingSeen) and events[1].step == 9 and 0 < events[1].seconds < 1
    assert events[2] == ProgressSeen(0, 9, 1.0)
    assert len(events) == 3


@pytest.mark.parametrize("line", [b"time 3", b"time x 0.1", b"time -3 0.1", b"time 3 fast", b"time 3 0.1 0.2",
                                  b"time 3 " + b"9" * 100, b"\xff\xfe time 3 0.1"])
def test_hostile_timing_lines_are_ignored(line: bytes) -> None:
    assert list(_progress_events(0, line + b"\n", 1.0)) == []


def test_the_sdk_is_a_no_op_outside_kcover_run() -> None:
    os.environ.pop(sdk._FD_VARIABLE, None)
    sdk.step_time(0.1)
    with sdk.timed():
        pass
