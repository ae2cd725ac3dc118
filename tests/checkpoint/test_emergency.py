"""On SIGTERM the newest in-memory snapshot reaches the disk within the grace period, then the process ends."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.checkpoint.conftest import WORKERS
from tests.checkpoint.states import OVERLAP_SCALE, assert_state, make_state

from kcover.checkpoint import Checkpointer


def start(*args: str) -> subprocess.Popen[str]:
    process = subprocess.Popen([sys.executable, str(WORKERS / "sigterm_saver.py"), *args],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert process.stdout is not None
    assert process.stdout.readline() == "ready\n", process.stderr.read() if process.stderr else ""
    return process


def stop(process: subprocess.Popen[str]) -> tuple[int, float, str]:
    began = time.monotonic()
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=20)
    return process.returncode, time.monotonic() - began, stderr


def on_disk(directory: Path, scale: int = 1) -> int:
    with Checkpointer(directory, shared_memory=None, emergency_save=False) as checkpointer:
        restored = checkpointer.load_latest()
    assert restored is not None
    assert_state(restored.state, make_state(restored.step, scale))
    return restored.step


@pytest.mark.parametrize(("mode", "exit_code"), [("sleep", -signal.SIGTERM), ("handler", 7)])
def test_sigterm_persists_the_memory_snapshot_then_ends_as_it_would_have(
    tmp_path: Path, shm_dir: Path, mode: str, exit_code: int
) -> None:
    process = start(str(tmp_path), str(shm_dir), mode)
    assert on_disk(tmp_path) == 1  # step 2 is in memory only
    code, seconds, stderr = stop(process)
    assert code == exit_code, stderr
    assert seconds < 10  # promptly: far inside any grace period (5 s flaked once on a loaded 2-core VM)
    assert "SIGTERM: step 2 persisted" in stderr
    assert on_disk(tmp_path) == 2


def test_sigterm_while_an_overlapped_copy_is_still_running(tmp_path: Path, shm_dir: Path) -> None:
    process = start(str(tmp_path), str(shm_dir), "overlap")
    code, seconds, stderr = stop(process)  # at once: the 256 MiB copy of step 2 has just begun
    assert code == -signal.SIGTERM, stderr
    assert seconds < 10
    assert "SIGTERM: step 2 persisted" in stderr  # it waited for the copy, then persisted a complete step 2
    assert on_disk(tmp_path, OVERLAP_SCALE) == 2


def test_sigterm_while_stuck_in_a_collective(tmp_path: Path, shm_dir: Path) -> None:
    store = str(tmp_path / "store")
    peer = subprocess.Popen([sys.executable, str(WORKERS / "sigterm_saver.py"), str(tmp_path / "peer"), str(shm_dir),
                             "barrier", "1", store], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        process = start(str(tmp_path / "ckpt"), str(shm_dir), "barrier", "0", store)
        time.sleep(0.3)  # rank 0 is now inside dist.barrier(), in C++
        code, seconds, stderr = stop(process)
        assert code == 128 + signal.SIGTERM, stderr
        assert seconds < 10  # promptly: far inside any grace period (5 s flaked once on a loaded 2-core VM)
        assert "main thread busy in native code" in stderr
        assert on_disk(tmp_path / "ckpt") == 2
    finally:
        peer.kill()
        peer.communicate()


@pytest.mark.parametrize(("mode", "exit_code", "persisted"), [
    ("sleep", -signal.SIGTERM, {"a": 2, "b": 3, "c": 4}),
    ("replaced", 128 + signal.SIGTERM, {"a": 2, "b": 3, "c": 4}),  # only the watcher thread can save
    ("closed", -signal.SIGTERM, {"a": 2, "b": 1, "c": 4}),
])
def test_several_checkpointers_in_one_process_all_save_on_sigterm_without_a_warning(
    tmp_path: Path, shm_dir: Path, mode: str, exit_code: int, persisted: dict[str, int]
) -> None:
    process = subprocess.Popen([sys.executable, str(WORKERS / "several_savers.py"), str(tmp_path), str(shm_dir), mode],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert process.stdout is not None
    assert process.stdout.readline() == "ready\n", process.communicate(timeout=20)
    code, _, stderr = stop(process)
    assert code == exit_code, stderr
    assert "wakeup fd" not in stderr  # before: "the signal wakeup fd is taken (asyncio?)", twice
    assert {name: on_disk(tmp_path / name) for name in "abc"} == persisted, stderr


def test_a_wakeup_fd_owned_by_someone_else_is_still_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import os

    read, write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    previous = signal.set_wakeup_fd(write)  # what asyncio does
    try:
        with caplog.at_level(logging.WARNING, "kcover.checkpoint"), Checkpointer(tmp_path, shared_memory=None):
            pass
        assert "wakeup fd is taken" in caplog.text
        assert signal.set_wakeup_fd(write) == write  # left to its owner, also after close()
    finally:
        signal.set_wakeup_fd(previous)
        os.close(read)
        os.close(write)


@pytest.mark.skipif(shutil.which("unshare") is None or os.geteuid() != 0, reason="needs unshare and root")
def test_sigterm_ends_a_worker_that_is_pid_1_of_its_namespace(tmp_path: Path, shm_dir: Path) -> None:
    """A container's command is PID 1 of its PID namespace, and the kernel drops a default-disposition
    SIGTERM for it: re-raising the signal after the emergency save used to leave the pod running until
    the kubelet's SIGKILL at the end of the grace period (seen on a real kubelet: exit 137 after 10 s)."""
    process = subprocess.Popen(["unshare", "--pid", "--fork", "--kill-child", sys.executable,
                                str(WORKERS / "sigterm_saver.py"), str(tmp_path), str(shm_dir), "sleep"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert process.stdout is not None
    assert process.stdout.readline() == "ready\n", process.stderr.read() if process.stderr else ""
    [child] = Path(f"/proc/{process.pid}/task/{process.pid}/children").read_text().split()
    nspid = next(line for line in Path(f"/proc/{child}/status").read_text().splitlines() if line.startswith("NSpid:"))
    assert nspid.split()[-1] == "1"  # PID 1 inside its namespace
    began = time.monotonic()
    os.kill(int(child), signal.SIGTERM)
    try:
        _, stderr = process.communicate(timeout=20)
    finally:
        process.kill()  # unshare --kill-child takes the worker with it
        process.communicate()
    assert process.returncode == 128 + signal.SIGTERM, stderr
    assert time.monotonic() - began < 5
    assert "SIGTERM: step 2 persisted" in stderr
    assert on_disk(tmp_path) == 2
