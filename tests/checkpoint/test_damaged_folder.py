"""A damaged checkpoint folder: what is not a regular file of bounded size is skipped with a warning.

A FIFO must not hang the reader, a symlink to ``/dev/zero`` must not be read
for ever, a symlink must not redirect a write or a delete, and bytes that are
not text must not crash the constructor.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from tests.checkpoint.states import assert_state, make_state

from kcover.checkpoint import Checkpointer


def save_steps(directory: Path, *steps: int, shared_memory: Path | None = None) -> None:
    with Checkpointer(directory, shared_memory=shared_memory, emergency_save=False, keep_last=5) as checkpointer:
        for step in steps:
            checkpointer.save(step, make_state(step))


def replace_with(path: Path, kind: str) -> None:
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dir":
        path.mkdir()
    else:
        path.symlink_to("/dev/zero")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["fifo", "dir", "zero"])
@pytest.mark.parametrize("name", ["rank-00000.json", "rank-00000.img"])
def test_a_file_of_the_newest_step_that_is_not_a_regular_file_is_skipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, kind: str, name: str
) -> None:
    save_steps(tmp_path, 1, 2)
    replace_with(tmp_path / "step-000000000002" / name, kind)
    with caplog.at_level(logging.WARNING, "kcover.checkpoint"), \
            Checkpointer(tmp_path, shared_memory=None, emergency_save=False) as checkpointer:
        restored = checkpointer.load_latest()
    assert restored is not None and restored.step == 1
    assert_state(restored.state, make_state(1))
    assert "skipping step 2" in caplog.text and "not a regular file" in caplog.text


@pytest.mark.timeout(60)
def test_a_huge_manifest_is_not_read(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    save_steps(tmp_path, 1, 2)
    with (tmp_path / "step-000000000002" / "rank-00000.json").open("r+b") as manifest:
        manifest.truncate(1 << 40)  # sparse: 1 TiB of zeros
    with caplog.at_level(logging.WARNING, "kcover.checkpoint"), \
            Checkpointer(tmp_path, shared_memory=None, emergency_save=False) as checkpointer:
        assert checkpointer.latest_step() == 1
        restored = checkpointer.load_latest()
    assert restored is not None and restored.step == 1
    assert "larger than" in caplog.text


@pytest.mark.parametrize("damage", [
    pytest.param(lambda path: path.write_bytes(b"\xff\xfe\x00 not utf-8"), id="not-utf-8"),
    pytest.param(lambda path: path.mkdir(), id="directory"),
    pytest.param(os.mkfifo, id="fifo"),
    pytest.param(lambda path: path.symlink_to("/dev/zero"), id="symlink-to-dev-zero"),
])
@pytest.mark.timeout(60)
def test_a_damaged_dir_id_is_said_and_checkpoints_still_work(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: Callable[[Path], object]
) -> None:
    damage(tmp_path / ".kcover-id")
    with caplog.at_level(logging.WARNING, "kcover.checkpoint"), \
            Checkpointer(tmp_path, shared_memory=None, emergency_save=False) as checkpointer:
        assert checkpointer.save(3, make_state(3))
        checkpointer.wait()
        assert checkpointer.last_error is None
        restored = checkpointer.load_latest()
    assert restored is not None and restored.step == 3
    assert str(tmp_path / ".kcover-id") in caplog.text


@pytest.mark.timeout(60)
def test_a_symlinked_snapshot_never_writes_through_to_its_target(tmp_path: Path, shm_dir: Path) -> None:
    save_steps(tmp_path / "ckpt", 1, shared_memory=shm_dir)
    (snapshot,) = shm_dir.glob("*.img")
    victim = tmp_path / "victim"
    victim.write_bytes(snapshot.read_bytes())  # a snapshot-looking file elsewhere
    before = victim.read_bytes()
    snapshot.unlink()
    snapshot.symlink_to(victim)
    next_buffer = snapshot.with_name(snapshot.name + ".next")
    other = tmp_path / "other"
    other.write_bytes(b"precious")
    next_buffer.symlink_to(other)
    with Checkpointer(tmp_path / "ckpt", shared_memory=shm_dir, emergency_save=False) as checkpointer:
        assert checkpointer.save(2, make_state(2), persist=False)
        assert checkpointer.save(3, make_state(3, scale=4), persist=False)  # bigger: a new buffer
        restored = checkpointer.load_latest()
        assert restored is not None and restored.step == 3
    assert victim.read_bytes() == before and other.read_bytes() == b"precious"


def test_a_symlinked_step_folder_is_never_pruned_through(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    save_steps(elsewhere, 1)
    directory = tmp_path / "ckpt"
    directory.mkdir()
    (directory / "step-000000000001").symlink_to(elsewhere / "step-000000000001")
    with Checkpointer(directory, shared_memory=None, emergency_save=False, keep_last=1) as checkpointer:
        for step in (2, 3):
            checkpointer.save(step, {"x": torch.ones(2)})
        checkpointer.wait()
    assert sorted(p.name for p in (elsewhere / "step-000000000001").iterdir()) == [
        "rank-00000.img", "rank-00000.json"]
