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


def test_empty_folder_is_nothing_read_not_no_fault(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    done = kcover("explain", str(tmp_path / "logs"))
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [f"kcover: nothing was read: no log file in {tmp_path / 'logs'}"]
    assert "no fault" not in done.stdout


def test_folder_of_unreadable_files_is_nothing_read(tmp_path: Path) -> None:
    (tmp_path / "dangling.log").symlink_to(tmp_path / "gone.log")
    (tmp_path / "loop.log").symlink_to(tmp_path / "loop.log")
    os.mkfifo(tmp_path / "pipe.log")
    done = kcover("explain", "--json", str(tmp_path))
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 4 and all("skipped" in line for line in lines[:3])
    assert lines[3].startswith(f"kcover: nothing was read: no log in {tmp_path} could be read (3 problems")
    assert json.loads(done.stdout)["status"] == "usage_error"


def test_symlink_loop_is_called_a_symlink_loop(tmp_path: Path) -> None:
    (tmp_path / "a.log").symlink_to(tmp_path / "b.log")
    (tmp_path / "b.log").symlink_to(tmp_path / "a.log")
    alone = kcover("explain", str(tmp_path / "a.log"))
    assert alone.returncode == 2
    assert alone.stderr.strip() == f"kcover: nothing was read: {tmp_path / 'a.log'}: symlink loop (ELOOP)"
    (tmp_path / "rank0.log").write_text(XID)
    inside = kcover("explain", str(tmp_path))
    assert inside.returncode == 1
    assert f"{tmp_path / 'a.log'}: symlink loop (ELOOP), skipped" in inside.stderr
    assert "no such file" not in inside.stderr


def test_escape_sequences_in_file_names_are_never_printed_raw(tmp_path: Path) -> None:
    evil = "node-\x1b]0;pwned\x07\x1b[2J"
    (tmp_path / evil).mkdir()
    (tmp_path / evil / "rank3.log").write_text(XID)
    (tmp_path / "\x1b[31mgone.log").symlink_to(tmp_path / "nowhere")
    (tmp_path / "[bold]node-7").mkdir()
    (tmp_path / "[bold]node-7" / "rank1.log").write_text(XID)
    done = kcover("explain", str(tmp_path))
    assert done.returncode == 1
    for text in (done.stdout, done.stderr):
        assert "\x1b" not in text and "\x07" not in text
    assert "\\x1b[31mgone.log: not a regular file (broken symlink)" in done.stderr
    assert "node-\\x1b]0;pwned\\x07\\x1b[2J" in done.stdout
    assert "[bold]node-7" in done.stdout  # shown as text, not taken as markup
    document = json.loads(kcover("explain", "--json", str(tmp_path)).stdout)
    assert sorted(document["verdict"]["nodes"]) == ["[bold]node-7", "node-\\x1b]0;pwned\\x07\\x1b[2J"]


def test_undecodable_node_names_give_valid_utf8_json(tmp_path: Path) -> None:
    folder = os.fsencode(tmp_path) + b"/node-\xff\xfe"
    os.mkdir(folder)
    with open(folder + b"/rank0.log", "wb") as log:
        log.write(XID.encode())
    os.symlink(b"/nowhere", os.fsencode(tmp_path) + b"/bad-\xff.log")
    done = subprocess.run([sys.executable, "-m", "kcover", "explain", "--json", os.fsencode(tmp_path)],
                          capture_output=True, check=False, timeout=60)
    assert done.returncode == 1
    text = done.stdout.decode("utf-8")  # strict
    assert "\\ud" not in text  # no lone surrogate, escaped or not
    document = json.loads(text)
    assert document["verdict"]["nodes"] == ["node-\\xff\\xfe"]
    assert document["faults"][0]["evidence"]["source"] == "node-\\xff\\xfe/rank0.log"
    assert any("bad-\\xff.log" in warning for warning in document["warnings"])
    table = subprocess.run([sys.executable, "-m", "kcover", "explain", os.fsencode(tmp_path)],
                           capture_output=True, check=False, timeout=60)
    assert "node-\\xff\\xfe" in table.stdout.decode("utf-8")
    assert b"Traceback" not in table.stderr


def test_closed_stdin_is_nothing_read_not_a_traceback() -> None:
    done = subprocess.run(["bash", "-c", 'exec "$@" <&-', "bash", sys.executable, "-m", "kcover", "explain"],
                          capture_output=True, text=True, check=False, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip() == "kcover: nothing was read: stdin is closed (give log files or folders, or pipe " \
                                  "logs in)"


def test_compressed_logs_on_stdin_and_as_files(tmp_path: Path) -> None:
    import gzip
    import zipfile

    piped = kcover("explain", stdin=gzip.compress(b"ok\n" + XID.encode()))
    assert piped.returncode == 1 and "gpu_hardware" in piped.stdout
    archive = tmp_path / "logs.zip"
    with zipfile.ZipFile(archive, "w") as packed:
        packed.writestr("node-2/rank5.log", XID)
    refused = kcover("explain", stdin=archive.read_bytes())
    assert refused.returncode == 2
    assert refused.stderr == (
        "kcover: nothing was read: <stdin>: a zip archive cannot be read from a pipe: give its path\n"
    )
    document = json.loads(kcover("explain", "--json", str(archive)).stdout)
    assert document["verdict"]["nodes"] == ["node-2"] and document["verdict"]["ranks"] == [5]
    cut = tmp_path / "rank0.log.gz"
    cut.write_bytes(gzip.compress(XID.encode() + bytes(range(256)) * 400)[:-100])
    done = kcover("explain", str(cut))
    assert done.returncode == 1 and "gpu_hardware" in done.stdout
    assert done.stderr.startswith(f"kcover: warning: {cut}: gzip data cut short or damaged after line ")
    assert "Traceback" not in done.stderr
    journal = tmp_path / "system.journal"
    journal.write_bytes(b"LPKSHHRH" + bytes(100))
    only = kcover("explain", str(journal))
    assert only.returncode == 2
    assert only.stderr.startswith(f"kcover: nothing was read: {journal}: a systemd journal file (binary)")
