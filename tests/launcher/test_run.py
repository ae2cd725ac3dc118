"""``kcover run`` end to end: real worker processes, real signals, real torch.distributed (gloo)."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

WORKERS = Path(__file__).parent / "workers"


def run(tmp_path: Path, script: str, *options: str, env: dict[str, str] | None = None,
        timeout: float = 120) -> tuple[int, dict[str, Any], str]:
    command = [sys.executable, "-m", "kcover", "run", "--json", "--quiet", "--state-dir", str(tmp_path / "state"),
               "--grace-period", "2", *options, "--", sys.executable, str(WORKERS / script)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False,
                          env={**os.environ, **(env or {})})
    document = json.loads(done.stdout) if done.stdout.strip() else {}
    return done.returncode, document, done.stderr


def test_xid_on_one_node_restarts_on_a_spare_and_succeeds(tmp_path: Path) -> None:
    code, doc, _ = run(tmp_path, "crash_xid.py", "--nproc-per-node", "2", "--nnodes", "2", "--spare-nodes", "1")
    assert code == 0
    assert doc["status"] == "succeeded"
    assert doc["restarts"] == 1
    assert doc["root_cause"] == {"category": "gpu_hardware", "rule": "xid.79.fallen-off-bus",
                                 "node": "node-0", "rank": 1}
    assert doc["excluded_nodes"] == ["node-0"]
    assert doc["attempts"][1]["nodes"] == ["node-2", "node-1"]
    assert {f["category"] for f in doc["faults"]} >= {"gpu_hardware"}
    assert 0 < doc["ettr"] < 1
    logs = sorted(p.name for p in (Path(doc["run_dir"]) / "attempt-1").glob("rank*.log"))
    assert logs == ["rank0.log", "rank1.log", "rank2.log", "rank3.log"]
    assert "fallen off the bus" in (Path(doc["run_dir"]) / "attempt-1" / "rank1.log").read_text()


def test_same_key_error_everywhere_fails_after_one_retry(tmp_path: Path) -> None:
    code, doc, _ = run(tmp_path, "keyerror.py", "--nproc-per-node", "3")
    assert code == 1
    assert doc["status"] == "failed"
    assert doc["restarts"] == 1
    assert doc["root_cause"]["category"] == "user_code"
    assert "deterministic user error" in doc["reason"]


def test_hang_in_allreduce_is_detected_stacks_kept_and_recovered(tmp_path: Path) -> None:
    started = time.monotonic()
    code, doc, _stderr = run(tmp_path, "hang_allreduce.py", "--nproc-per-node", "2", "--hang-timeout", "4",
                       "--startup-timeout", "60")
    assert code == 0, (doc, _stderr[-3000:])
    assert doc["restarts"] == 1
    first = doc["attempts"][0]
    assert first["outcome"] == "hung"
    assert first["root_cause"]["category"] == "collective_timeout_hang"
    assert first["max_step"] == 2
    hang_seen = first["timings"]["first_fault_seconds"] - first["timings"]["first_progress_seconds"]
    assert 4 <= hang_seen <= 4 + 5
    assert time.monotonic() - started < 90
    stacks = (Path(doc["run_dir"]) / "attempt-1" / "stacks.txt").read_text()
    assert "rank 1" in stacks


def test_the_rank_the_others_timed_out_waiting_for_is_named(tmp_path: Path) -> None:
    """Real gloo: rank 0 stops before an all_reduce; ranks 1-3 time out in it (3 s) and die; rank 0 logs nothing."""
    code, doc, stderr = run(tmp_path, "late_rank.py", "--nproc-per-node", "4", "--hang-timeout", "60")
    assert code == 0, (doc, stderr[-3000:])
    first = doc["attempts"][0]
    assert first["root_cause"]["category"] == "collective_timeout_hang"
    assert first["root_cause"]["ranks"] == [0]
    assert first["root_cause"]["nodes"] == [] and first["root_cause"]["action"] == "restart"
    assert "rank 0 on node-0 did not time out while ranks 1, 2, 3 timed out waiting for it" in first["reason"]
    assert doc["status"] == "succeeded" and doc["restarts"] == 1


def test_hang_at_the_same_step_twice_fails_fast(tmp_path: Path) -> None:
    code, doc, _ = run(tmp_path, "hang_allreduce.py", "--nproc-per-node", "2", "--hang-timeout", "3",
                       env={"HANG_EVERY_TIME": "1"})
    assert code == 1
    assert doc["restarts"] == 1
    assert "hang recurred at step 2" in doc["reason"]


def test_workers_ignoring_sigterm_are_killed_after_the_grace_period(tmp_path: Path) -> None:
    code, doc, _ = run(tmp_path, "ignore_sigterm.py", "--nproc-per-node", "3", "--max-restarts", "0")
    assert code == 1
    stop = doc["attempts"][0]["timings"]["stop_seconds"]
    assert 2.0 <= stop < 8
    assert doc["root_cause"]["category"] == "cuda_software"


def test_forked_and_setsid_children_do_not_survive(tmp_path: Path) -> None:
    code, doc, _ = run(tmp_path, "fork_children.py", "--nproc-per-node", "2", "--max-restarts", "0")
    assert code == 1
    assert doc["root_cause"]["category"] == "other"
    # the autouse fixture fails this test if any "sleeper" survived


def test_one_megabyte_lines_do_not_hide_the_fault(tmp_path: Path) -> None:
    code, doc, _ = run(tmp_path, "big_lines.py", "--nproc-per-node", "2")
    assert code == 0
    assert doc["attempts"][0]["root_cause"]["category"] == "gpu_memory_oom"


def test_sdk_progress_checkpoints_and_history(tmp_path: Path) -> None:
    code, doc, _ = run(tmp_path, "ok.py", "--nproc-per-node", "2")
    assert code == 0
    assert doc["restarts"] == 0
    assert doc["attempts"][0]["max_step"] == 4
    history = subprocess.run([sys.executable, "-m", "kcover", "history", "--state-dir", str(tmp_path / "state")],
                             capture_output=True, text=True, check=True)
    assert "succeeded" in history.stdout


def test_injected_node_fault_follows_the_node(tmp_path: Path) -> None:
    code, doc, _ = run(tmp_path, "ok.py", "--nproc-per-node", "1", "--nnodes", "2", "--spare-nodes", "1",
                       "--inject", "xid48@node-1:after=0")
    assert code == 0
    assert doc["excluded_nodes"] == ["node-1"]
    assert doc["root_cause"]["rule"] == "xid.48.double-bit-ecc"
    assert doc["attempts"][1]["nodes"] == ["node-0", "node-2"]


def test_command_not_found_is_a_usage_error_and_starts_nothing(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "kcover", "run", "--state-dir", str(tmp_path / "s"), "--",
                           "no-such-trainer"], capture_output=True, text=True, check=False)
    assert done.returncode == 2
    assert "command not found on PATH: no-such-trainer" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "s" / "kcover.db").exists()


def test_unwritable_state_dir_is_refused_before_launch(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    done = subprocess.run([sys.executable, "-m", "kcover", "run", "--state-dir", str(blocker / "state"), "--",
                           sys.executable, str(WORKERS / "ok.py")], capture_output=True, text=True, check=False)
    assert done.returncode == 2
    assert "is not writable" in done.stderr


def test_bad_injection_is_a_usage_error(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "kcover", "run", "--inject", "melt@rank0", "--", "true"],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 2
    assert "unknown kind 'melt'" in done.stderr


def test_sigterm_to_kcover_stops_workers_and_records_interrupted(tmp_path: Path) -> None:
    state = tmp_path / "state"
    process = subprocess.Popen(
        [sys.executable, "-m", "kcover", "run", "--json", "--quiet", "--state-dir", str(state), "--grace-period", "2",
         "--nproc-per-node", "2", "--", sys.executable, str(WORKERS / "ignore_sigterm.py")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    deadline = time.monotonic() + 30
    while not list(state.glob("runs/*/attempt-1/rank1.log")) and time.monotonic() < deadline:
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    out, _ = process.communicate(timeout=30)
    assert process.returncode == 130
    assert json.loads(out)["status"] == "interrupted"
    rows = sqlite3.connect(state / "kcover.db").execute("SELECT status FROM runs").fetchall()
    assert rows == [("interrupted",)]


def test_corrupt_state_database_is_moved_aside(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "kcover.db").write_bytes(b"this is not sqlite" * 100)
    (state / "keep.txt").write_text("mine")
    code, doc, stderr = run(tmp_path, "ok.py")
    assert code == 0
    assert doc["status"] == "succeeded"
    assert "was unreadable" in stderr
    assert len(list(state.glob("kcover.db.corrupt-*"))) == 1
    assert (state / "keep.txt").read_text() == "mine"


def test_failed_preflight_starts_nothing(tmp_path: Path) -> None:
    config = tmp_path / "health.yaml"
    config.write_text("suites: {quick: [storage.free]}\nstorage: {min_free_gb: 1000000}\n")
    state = tmp_path / "state"
    done = subprocess.run([sys.executable, "-m", "kcover", "run", "--preflight", "--health-config", str(config),
                           "--state-dir", str(state), "--", sys.executable, str(WORKERS / "ok.py")],
                          capture_output=True, text=True, check=False, timeout=120)
    assert done.returncode == 1
    assert "preflight failed, nothing started: storage.free" in done.stderr
    assert not (state / "runs").exists()


def test_unknown_error_is_other_with_its_line_and_the_user_code_budget(tmp_path: Path) -> None:
    code, doc, stderr = run(tmp_path, "unknown_error.py", "--nproc-per-node", "2", "--max-restarts", "3")
    assert code == 1, (doc, stderr[-3000:])
    assert doc["restarts"] == 1  # one retry: the user-code budget, not --max-restarts
    assert doc["root_cause"]["category"] == "other"
    assert doc["root_cause"]["rule"] == "job.unrecognised-failure"
    assert doc["root_cause"]["rank"] == 1
    assert "no rule recognises, seen 2 times" in doc["reason"]
    evidence = [f["evidence"]["line"] for f in doc["faults"] if f["rule"] == "job.unrecognised-failure"]
    assert set(evidence) == {"Exception: dataset shard 17 is unreadable"}  # once per attempt
