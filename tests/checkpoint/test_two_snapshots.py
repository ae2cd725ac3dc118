"""Shared memory keeps the snapshot before the newest: a kill during a save, or ranks one step apart, lose nothing.

Real processes killed with SIGKILL in the middle of a snapshot's copy, and a real two-rank gloo group whose
ranks' newest snapshots differ by a step; ``memory_snapshots=1`` (one file, written in place) is the baseline
that loses the memory in both cases.
"""

from __future__ import annotations

import logging
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.checkpoint.states import assert_state, make_state
from tests.checkpoint.test_faults import mb, tmpfs

from kcover.checkpoint import Checkpointer
from kcover.checkpoint.image import WRITING

WORKERS = Path(__file__).parent / "workers"


def state_field(path: Path) -> int | None:
    try:
        with path.open("rb") as file:
            header = file.read(16)
    except FileNotFoundError:
        return None
    return struct.unpack_from("<I", header, 12)[0] if len(header) == 16 else None


@pytest.mark.timeout(120)
@pytest.mark.parametrize("memory_snapshots", [2, 1])
def test_a_worker_killed_in_the_middle_of_a_snapshot_restores_the_one_before_from_memory(
    tmp_path: Path, shm_dir: Path, memory_snapshots: int
) -> None:
    worker = subprocess.Popen([sys.executable, str(WORKERS / "save_until_killed.py"), str(tmp_path), str(shm_dir),
                               str(memory_snapshots)], stdout=subprocess.PIPE, text=True)
    try:
        assert worker.stdout is not None
        while (line := worker.stdout.readline()) and line.strip() != "saved 2":
            pass
        assert line.strip() == "saved 2", worker.wait()
        (snapshot,) = shm_dir.glob("*.img")
        being_written = snapshot.with_name(snapshot.name + ".next") if memory_snapshots == 2 else snapshot
        deadline = time.monotonic() + 60
        while state_field(being_written) != WRITING:  # the worst moment: half of a snapshot's bytes copied
            assert time.monotonic() < deadline and worker.poll() is None
        os.kill(worker.pid, signal.SIGKILL)
    finally:
        worker.kill()
        worker.communicate()
    with Checkpointer(tmp_path, shared_memory=shm_dir, emergency_save=False,
                      memory_snapshots=memory_snapshots) as restarted:
        restored = restarted.load_latest()
    if memory_snapshots == 1:  # the one file was being overwritten, and nothing was persisted
        assert restored is None
        return
    assert restored is not None and restored.source == "memory" and restored.step >= 2
    assert_state(restored.state, make_state(restored.step, 8192))


def run_ranks(tmp_path: Path, phase: str, shm: str) -> list[str]:
    store = tmp_path / f"store-{phase}-{time.monotonic_ns()}"
    ranks = [subprocess.Popen([sys.executable, str(WORKERS / "one_step_apart.py"), str(tmp_path / "ckpt"), shm,
                               str(rank), phase, str(store)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for rank in ((0, 1) if phase != "redo" else (1,))]
    outputs = []
    for rank in ranks:
        out, err = rank.communicate(timeout=90)
        assert rank.returncode == 0, err[-2000:]
        outputs += out.split("\n")[:-1]
    return outputs


@pytest.mark.timeout(300)
@pytest.mark.parametrize("where", ["memory", "disk"])
def test_ranks_one_step_apart_agree_on_a_step_and_never_mix_in_the_abandoned_one(
    tmp_path: Path, shm_dir: Path, where: str
) -> None:
    shm = str(shm_dir) if where == "memory" else "none"
    run_ranks(tmp_path, "save", shm)  # rank 0 committed step 3, rank 1 died before its commit of step 3
    assert run_ranks(tmp_path, "restore", shm) == [f"restored 2 {where} step-2", f"restored 2 {where} step-12"]
    # the job redoes step 3: rank 1 commits it, rank 0 dies before its commit.  Rank 0's old step 3 belongs to
    # the abandoned timeline: it was withdrawn at the restore, so the ranks cannot resume from two different 3s
    run_ranks(tmp_path, "redo", shm)
    assert run_ranks(tmp_path, "restore", shm) == [f"restored 2 {where} step-2", f"restored 2 {where} step-12"]
    if where == "disk":  # rank 0's old step 3 is uncommitted, and its image goes with the next writer's leftovers
        assert not (tmp_path / "ckpt" / "step-000000000003" / "rank-00000.json").exists()


def test_no_room_for_a_second_snapshot_keeps_one_written_in_place(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with tmpfs(tmp_path / "shm", "size=3m") as shm, caplog.at_level(logging.WARNING, "kcover.checkpoint"):
        with Checkpointer(tmp_path / "ckpt", shared_memory=shm, emergency_save=False) as checkpointer:
            for step in (1, 2, 3):
                assert checkpointer.save(step, {"x": mb(2)["x"] * step}, persist=False)
            restored = checkpointer.load_latest()
            assert restored is not None and (restored.step, restored.source) == (3, "memory")
            assert (restored.state["x"] == 3).all()
        assert "no room for a second snapshot" in caplog.text and "private memory" not in caplog.text
        assert [p.name for p in shm.iterdir()] == [restored.where.rsplit("/", 1)[1]]  # no half-reserved file


@pytest.mark.parametrize("value", [0, 3, -1, 1.0, "2", None])
def test_memory_snapshots_is_one_or_two(tmp_path: Path, value: object) -> None:
    with pytest.raises(ValueError, match="memory_snapshots must be 1 or 2"):
        Checkpointer(tmp_path, shared_memory=None, emergency_save=False, memory_snapshots=value)  # type: ignore[arg-type]


def resident_kib(path: Path) -> int:
    """How much of ``path`` this process has mapped in (``Rss`` of its mappings in /proc/self/smaps)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split()
        if fields and "-" in fields[0] and len(fields) >= 5:  # a mapping's header line
            inside = len(fields) >= 6 and fields[5] == str(path)
        elif inside and fields[:1] == ["Rss:"]:
            total += int(fields[1])
    return total


@pytest.mark.timeout(60)
def test_after_the_first_save_the_second_file_is_reserved_and_faulted_in(tmp_path: Path, shm_dir: Path) -> None:
    with Checkpointer(tmp_path, shared_memory=shm_dir, emergency_save=False) as checkpointer:
        checkpointer.save(1, make_state(1, 512), persist=False)  # 16 MiB
        (snapshot,) = shm_dir.glob("*.img")
        spare = snapshot.with_name(snapshot.name + ".next")
        deadline = time.monotonic() + 30
        while not (spare.exists() and resident_kib(spare) * 1024 >= spare.stat().st_size):
            assert time.monotonic() < deadline, (spare.exists(), resident_kib(spare))
            time.sleep(0.02)
        assert spare.stat().st_size >= snapshot.stat().st_size - (64 << 10)
    assert not spare.exists()  # reserved, never written: closing removes it
