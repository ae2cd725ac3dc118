"""``kcover explain`` as a user runs it: a real process, real files, exit codes and JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

XID = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python, GPU has fallen off the bus.\n"


def kcover(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "kcover", *args], input=stdin, capture_output=True, check=False, timeout=60
    )
    return subprocess.CompletedProcess(
        done.args, done.returncode, done.stdout.decode(), done.stderr.decode()
    )


def test_stdin_fatal_fault_exits_1_with_table() -> None:
    done = kcover("explain", stdin=XID.encode())
    assert done.returncode == 1
    assert "gpu_hardware" in done.stdout
    assert "restart_excluding_nodes" in done.stdout
    assert "Traceback" not in done.stderr


def test_benign_input_exits_0() -> None:
    done = kcover("explain", stdin=b"step 1 loss 2.0\nNCCL INFO Bootstrap : Using eth0\n")
    assert done.returncode == 0
    assert "no fault found" in done.stdout


def test_json_document_for_a_job_folder(tmp_path: Path) -> None:
    (tmp_path / "node-0").mkdir()
    (tmp_path / "node-1").mkdir()
    (tmp_path / "node-0" / "rank0.log").write_text(
        "ok\n[rank0]: torch.distributed.DistBackendError: NCCL error in: x.cpp:1, remote process exited "
        "or there was a network error, NCCL version 2.20.5\n"
    )
    (tmp_path / "node-1" / "rank1.log").write_text("ok\n" + XID)
    done = kcover("explain", "--json", str(tmp_path))
    assert done.returncode == 1
    document = json.loads(done.stdout)
    verdict = document["verdict"]
    assert verdict["category"] == "gpu_hardware"
    assert verdict["action"] == "restart_excluding_nodes"
    assert verdict["nodes"] == ["node-1"]
    assert verdict["ranks"] == [1]
    assert document["engine"] in ("hyperscan", "re")
    by_rule = {fault["rule"]: fault for fault in document["faults"]}
    assert by_rule["nccl.remote-error"]["role"] == "cascade"
    assert by_rule["nccl.remote-error"]["node"] == "node-0"
    assert by_rule["xid.79.fallen-off-bus"]["evidence"]["line_number"] == 2


def test_unreadable_entries_are_named_and_skipped(tmp_path: Path) -> None:
    (tmp_path / "rank0.log").write_text(XID)
    (tmp_path / "dangling.log").symlink_to(tmp_path / "gone.log")
    os.mkfifo(tmp_path / "pipe.log")
    done = kcover("explain", str(tmp_path), str(tmp_path / "missing.log"))
    assert done.returncode == 1
    assert "dangling.log: not a regular file" in done.stderr
    assert "pipe.log: not a regular file" in done.stderr
    assert "missing.log: no such file" in done.stderr
    assert "Traceback" not in done.stderr


def test_only_missing_paths_is_a_usage_error(tmp_path: Path) -> None:
    done = kcover("explain", str(tmp_path / "nope.log"))
    assert done.returncode == 2
    assert "nope.log" in done.stderr


def test_bad_option_is_a_usage_error() -> None:
    assert kcover("explain", "--engine", "magic").returncode == 2
    assert kcover("explain", "--no-such-flag").returncode == 2


def test_invalid_user_catalog_names_file_rule_and_field(tmp_path: Path) -> None:
    catalog = tmp_path / "mine.yaml"
    catalog.write_text(
        "rules:\n  - id: my.rule\n    title: t\n    category: nope\n    severity: fatal\n"
        "    retriable: true\n    node_at_fault: false\n    role: root\n    remediation: r\n"
        "    patterns: ['x']\n"
    )
    done = kcover("explain", "--catalog", str(catalog), stdin=b"x\n")
    assert done.returncode == 2
    assert "mine.yaml" in done.stderr
    assert "'my.rule'" in done.stderr
    assert "'category'" in done.stderr
    assert "Traceback" not in done.stderr


def test_pure_python_engine_gives_the_same_verdict() -> None:
    text = (XID + "RuntimeError: CUDA error: unspecified launch failure\n").encode()
    fast = json.loads(kcover("explain", "--json", stdin=text).stdout)
    slow = json.loads(kcover("explain", "--json", "--engine", "re", stdin=text).stdout)
    assert slow["engine"] == "re"
    assert fast["verdict"] == slow["verdict"]
    assert [f["rule"] for f in fast["faults"]] == [f["rule"] for f in slow["faults"]]
