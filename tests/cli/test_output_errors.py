"""Where kcover's output really goes: a full disk, a closed pipe, a closed stdout, a broken stderr.

Each case runs the real ``kcover`` with its stdout or stderr set up the way a
shell would (``> /dev/full``, ``| head -c0``, ``>&-``): never a traceback; one
line on stderr and exit 74 when the results could not be written; a quiet exit
141 (as a tool killed by SIGPIPE) when the reader has gone.  And what kcover
shows of the outside world (a path) never reaches the terminal as escapes.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import IO, Any

import pytest

XID = b"NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python, GPU has fallen off the bus.\n"
KCOVER = [sys.executable, "-m", "kcover"]


def kcover(*args: str, stdout: int | IO[Any], stderr: int | IO[Any] = subprocess.PIPE,
           close_stdout: bool = False) -> subprocess.CompletedProcess[bytes]:
    command = [*KCOVER, *args]
    if close_stdout:  # as a shell's `>&-`
        command = ["bash", "-c", 'exec "$@" >&-', "bash", *command]
    return subprocess.run(command, stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL, timeout=120,
                          check=False)


@pytest.fixture
def job(tmp_path: Path) -> Path:
    log = tmp_path / "rank0.log"
    log.write_bytes(XID)
    return log


@pytest.mark.parametrize("args", [[], ["--json"]], ids=["table", "json"])
def test_full_disk_on_stdout_is_one_line_and_exit_74(job: Path, args: list[str]) -> None:
    with open("/dev/full", "wb") as full:
        done = kcover("explain", *args, str(job), stdout=full)
    stderr = done.stderr.decode()
    assert done.returncode == 74, stderr
    assert stderr.strip().splitlines() == ["kcover: cannot write the output to stdout: No space left on device"]


def test_full_disk_for_check_list_and_run_json(tmp_path: Path) -> None:
    with open("/dev/full", "wb") as full:
        listed = kcover("check", "--list", stdout=full)
        ran = kcover("run", "--json", "--quiet", "--state-dir", str(tmp_path / "s"), "--", sys.executable, "-c", "",
                     stdout=full)
    for done in (listed, ran):
        assert done.returncode == 74, done.stderr
        assert b"Traceback" not in done.stderr
        assert done.stderr.decode().strip().splitlines()[-1].startswith("kcover: cannot write the output")


@pytest.mark.parametrize("args", [[], ["--json"]], ids=["table", "json"])
def test_closed_pipe_exits_quietly(job: Path, args: list[str]) -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone, as after `| head -c0`
    try:
        done = kcover("explain", *args, str(job), stdout=write_end)
    finally:
        os.close(write_end)
    assert done.returncode == 141
    assert done.stderr == b""


def test_closed_stdout_is_reported_and_no_file_receives_the_output(tmp_path: Path) -> None:
    state = tmp_path / "state"
    done = kcover("run", "--json", "--quiet", "--state-dir", str(state), "--", sys.executable, "-c", "",
                  stdout=subprocess.PIPE, close_stdout=True)
    assert done.returncode == 74, done.stderr
    assert done.stderr.decode().strip().splitlines()[-1] == "kcover: cannot write the output to stdout: " \
                                                            "Bad file descriptor"
    assert sqlite3.connect(state / "kcover.db").execute("PRAGMA integrity_check").fetchone() == ("ok",)
    for path in state.rglob("*"):
        if path.is_file():
            assert b'"status"' not in path.read_bytes(), path


def test_broken_stderr_does_not_change_the_result(job: Path) -> None:
    missing = str(job.parent / "missing.log")
    with open("/dev/full", "wb") as full:
        done = kcover("explain", "--json", str(job), missing, stdout=subprocess.PIPE, stderr=full)
    assert done.returncode == 1
    assert json.loads(done.stdout)["verdict"]["rule"] == "xid.79.fallen-off-bus"


def test_run_json_is_valid_utf8_for_an_undecodable_state_dir(tmp_path: Path) -> None:
    state = os.fsencode(tmp_path) + b"/state-\xff"
    done = subprocess.run([*KCOVER, "run", "--json", "--quiet", "--state-dir", state, "--", sys.executable, "-c",
                           ""], capture_output=True, stdin=subprocess.DEVNULL, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout.decode("utf-8"))  # strict: a lone surrogate would not decode
    assert document["state_dir"].endswith("state-\\xff")
    assert "\\udcff" not in done.stdout.decode()


def test_run_with_a_full_stderr_still_supervises_and_reports(tmp_path: Path) -> None:
    with open("/dev/full", "wb") as full:
        done = kcover("run", "--json", "--state-dir", str(tmp_path / "s"), "--", sys.executable, "-c",
                      "print('step 1 ' * 100)", stdout=subprocess.PIPE, stderr=full)
    assert done.returncode == 0
    assert json.loads(done.stdout)["status"] == "succeeded"
    logs = list((tmp_path / "s").rglob("rank0.log"))  # the worker's output still reached its log
    assert logs and b"step 1" in logs[0].read_bytes()


def test_check_shows_an_outside_path_as_escaped_text(tmp_path: Path) -> None:
    folder = tmp_path / "ckpt\x1b[31m[bold]"
    folder.mkdir()
    done = kcover("check", "--only", "storage.free", "--checkpoint-dir", str(folder), stdout=subprocess.PIPE)
    text = done.stdout.decode()
    assert "\x1b" not in text
    assert "ckpt\\x1b[31m[bold]" in "".join(text.split())  # wherever the table wrapped it
