"""Two processes on one dir and rank: a reader never disturbs the writer, a second writer is refused.

An evaluation process calling ``load_latest()``, a leftover worker or two runs
sharing a state dir all open a Checkpointer on files a live writer is using.
Every party here is a real process (``workers/commanded.py``); the writer's
lock is an OS lock, so a writer killed with SIGKILL leaves nothing that blocks
the next one.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from tests.checkpoint.conftest import WORKERS
from tests.checkpoint.states import make_state

from kcover.checkpoint import Checkpointer, CheckpointInUseError


class Party:
    """One process holding a Checkpointer on ``directory``, rank 0, answering commands."""

    def __init__(self, directory: Path, shm: Path) -> None:
        self.process = subprocess.Popen([sys.executable, str(WORKERS / "commanded.py"), str(directory), str(shm)],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        text=True)
        assert self.ask_raw() == "ready", self.stop()

    def ask_raw(self) -> str:
        assert self.process.stdout is not None
        return self.process.stdout.readline().strip()

    def ask(self, command: str) -> str:
        assert self.process.stdin is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        return self.ask_raw()

    def stop(self) -> str:
        if self.process.poll() is None:
            self.process.kill()
        return self.process.communicate(timeout=30)[1]


@pytest.fixture
def parties(tmp_path: Path, shm_dir: Path) -> Iterator[list[Party]]:
    started: list[Party] = []
    yield started
    for party in started:
        party.stop()


def test_a_reader_process_never_breaks_the_writer(tmp_path: Path, shm_dir: Path, parties: list[Party]) -> None:
    writer = Party(tmp_path, shm_dir)
    parties.append(writer)
    assert writer.ask("save 1") == "ok True None"
    assert writer.ask("reserve 4") == "ok"  # a bigger buffer for the next snapshot waits in shared memory
    reader = Party(tmp_path, shm_dir)
    parties.append(reader)
    assert reader.ask("load") == "ok 1"
    assert reader.ask("close") == "ok"
    assert writer.ask("save 2 4") == "ok True None"  # before: FileNotFoundError, the reader unlinked it
    with Checkpointer(tmp_path, shared_memory=shm_dir, emergency_save=False) as restarted:
        restored = restarted.load_latest()
        assert restored is not None and restored.step == 2


def test_a_reader_leaves_the_writers_files_in_flight_alone(tmp_path: Path, shm_dir: Path,
                                                            parties: list[Party]) -> None:
    writer = Party(tmp_path, shm_dir)
    parties.append(writer)
    assert writer.ask("save 1") == "ok True None"
    in_flight = tmp_path / "step-000000000002" / ".rank-00000.img.tmp"  # as during the writer's next persist
    in_flight.parent.mkdir()
    in_flight.write_bytes(b"being written")
    with Checkpointer(tmp_path, shared_memory=shm_dir, emergency_save=False) as reader:
        assert reader.latest_step() == 1
    assert in_flight.exists()  # before: removed as a dead writer's leftover


def test_a_second_writer_is_refused_until_the_first_is_killed(tmp_path: Path, shm_dir: Path,
                                                              parties: list[Party]) -> None:
    writer = Party(tmp_path, shm_dir)
    parties.append(writer)
    assert writer.ask("save 1") == "ok True None"
    rival = Party(tmp_path, shm_dir)
    parties.append(rival)
    answer = rival.ask("save 5")
    assert answer.startswith("error CheckpointInUseError:"), answer
    assert f"pid {writer.process.pid}" in answer and str(tmp_path) in answer and "rank 0" in answer
    assert rival.ask("memory 6").startswith("error CheckpointInUseError:")  # a memory snapshot writes too
    assert writer.ask("save 2") == "ok True None"  # the writer was not disturbed
    writer.process.send_signal(signal.SIGKILL)
    writer.process.wait(timeout=30)
    assert rival.ask("save 7") == "ok True None"  # the lock died with the killed writer
    assert rival.ask("load") == "ok 7"


def test_two_writers_in_one_process_are_refused(tmp_path: Path) -> None:
    with Checkpointer(tmp_path, shared_memory=None, emergency_save=False) as first, \
            Checkpointer(tmp_path, shared_memory=None, emergency_save=False) as second:
        assert first.save(1, make_state(1))
        with pytest.raises(CheckpointInUseError, match="another Checkpointer in this process"):
            second.save(2, make_state(2))
        first.wait()
    with Checkpointer(tmp_path, shared_memory=None, emergency_save=False) as after_close:
        assert after_close.save(3, {"x": torch.ones(1)})  # close() let the lock go


HOLD_AS_ANOTHER_POD = """
import socket, sys, time
from pathlib import Path
socket.sethostname("trainer-worker-3")
from kcover.checkpoint import Checkpointer
with Checkpointer(Path(sys.argv[1]), shared_memory=None, emergency_save=False) as held:
    held.save(1, {"x": __import__("torch").ones(1)})
    print("held", flush=True)
    time.sleep(60)
"""


def test_a_writer_in_another_pod_is_named_by_its_pid_and_host(tmp_path: Path) -> None:
    """On a shared volume the holder is another pod's process, pid 1 in its own namespaces: the refusal
    names it with its host (a pid alone named nothing, and one equal to ours read "this process")."""
    import os
    import shutil

    if os.geteuid() != 0 or shutil.which("unshare") is None or subprocess.run(
            ["unshare", "--uts", "--pid", "--fork", "true"], capture_output=True, check=False).returncode != 0:
        pytest.skip("needs root and unshare (uts and pid namespaces)")
    pod = subprocess.Popen(["unshare", "--uts", "--pid", "--fork", "--kill-child", sys.executable, "-c",
                            HOLD_AS_ANOTHER_POD, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert pod.stdout is not None and pod.stdout.readline().strip() == "held"
        with Checkpointer(tmp_path, shared_memory=None, emergency_save=False) as mine, \
                pytest.raises(CheckpointInUseError, match=r"^the process pid 1 on trainer-worker-3 is already writing"):
            mine.save(2, {"x": torch.ones(1)})
    finally:
        pod.kill()  # and with it its child, pid 1 of the namespace (--kill-child)
        pod.wait(10)
        assert pod.stdout is not None
        pod.stdout.close()


def test_a_holder_with_our_pid_elsewhere_is_not_taken_for_this_process(tmp_path: Path) -> None:
    """Two containers, each with its trainer as the same pid: only pid, host and pid namespace together
    say "this process"."""
    import fcntl
    import os
    import socket

    from kcover.lockfile import Holder, read_holder, write_holder

    path = tmp_path / ".rank-00000.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # a second open file description: held as by another process
        write_holder(fd)
        ours = read_holder(fd)
        assert ours is not None and ours.pid == os.getpid() and ours.host == socket.gethostname()
        assert ours.is_this_process
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} trainer-worker-3 pid:[4026531836]\n".encode(), 0)
        with Checkpointer(tmp_path, shared_memory=None, emergency_save=False) as mine, \
                pytest.raises(CheckpointInUseError, match=rf"^the process pid {os.getpid()} on trainer-worker-3 is"):
            mine.save(1, {"x": torch.ones(1)})
        assert not Holder(os.getpid(), "trainer-worker-3", ours.namespace).is_this_process
        assert not Holder(os.getpid(), socket.gethostname(), "pid:[1]").is_this_process
        assert Holder(os.getpid()).is_this_process, "a file from an older kcover: the pid alone"
        os.ftruncate(fd, 0)
        os.pwrite(fd, b"7 \x1b[2Jhost\x07 ns\n", 0)
        assert read_holder(fd) == Holder(7, None, "ns"), "a planted escape code is never printed"
    finally:
        os.close(fd)

