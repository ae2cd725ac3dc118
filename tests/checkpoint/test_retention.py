"""Retention keeps the last N and every K-th step, deletes only this rank's files, and cleans up after kills."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tests.checkpoint.states import assert_state, make_state

from kcover.checkpoint import Checkpointer


def steps_on_disk(directory: Path, rank: int = 0) -> list[int]:
    return sorted(int(p.parent.name[5:]) for p in directory.glob(f"step-*/rank-{rank:05d}.json"))


def test_keep_last_and_keep_every(tmp_path: Path) -> None:
    with Checkpointer(tmp_path, shared_memory=None, emergency_save=False, keep_last=2, keep_every=5) as checkpointer:
        for step in range(1, 13):
            checkpointer.save(step, {"x": torch.full((4,), float(step))})
        checkpointer.wait()
    assert steps_on_disk(tmp_path) == [5, 10, 11, 12]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".kcover-id", ".rank-00000.lock", "step-000000000005", "step-000000000010", "step-000000000011",
        "step-000000000012"]


def test_ranks_sharing_a_dir_prune_only_their_own_files(tmp_path: Path) -> None:
    options = {"shared_memory": None, "emergency_save": False, "keep_last": 1, "world_size": 2}
    with Checkpointer(tmp_path, rank=0, **options) as rank0, Checkpointer(tmp_path, rank=1, **options) as rank1:
        rank1.save(1, {"x": torch.ones(2)})
        rank1.wait()
        for step in (1, 2, 3):
            rank0.save(step, {"x": torch.ones(2)})
        rank0.wait()
    assert steps_on_disk(tmp_path, 0) == [3]
    assert steps_on_disk(tmp_path, 1) == [1]  # rank 0 pruned step 1 but left rank 1's shard alone
    assert (tmp_path / "step-000000000001" / "rank-00001.img").is_file()
    assert not (tmp_path / "step-000000000002").exists()  # empty step folders go


def test_leftovers_of_a_killed_writer_are_removed_on_start(tmp_path: Path) -> None:
    with Checkpointer(tmp_path, shared_memory=None, emergency_save=False) as checkpointer:
        checkpointer.save(1, {"x": torch.ones(2)})
    folder = tmp_path / "step-000000000002"
    folder.mkdir()
    (folder / ".rank-00000.img.tmp").write_bytes(b"partial")
    (folder / "rank-00000.img").write_bytes(b"renamed but never committed")
    (folder / ".rank-00001.img.tmp").write_bytes(b"another rank's: not ours to delete")
    with Checkpointer(tmp_path, shared_memory=None, emergency_save=False) as restarted:
        assert restarted.latest_step() == 1
    assert sorted(p.name for p in folder.iterdir()) == [".rank-00001.img.tmp"]


def flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def test_a_damaged_newer_checkpoint_never_costs_the_one_just_written(tmp_path: Path) -> None:
    with Checkpointer(tmp_path, shared_memory=None, emergency_save=False) as checkpointer:
        checkpointer.save(20, make_state(20))
    flip_byte(tmp_path / "step-000000000020" / "rank-00000.img", 5000)
    with Checkpointer(tmp_path, shared_memory=None, emergency_save=False, keep_last=1) as checkpointer:
        assert checkpointer.save(12, make_state(12))
        checkpointer.wait()
    assert steps_on_disk(tmp_path) == [12, 20]  # before: only the damaged step 20 was left
    with Checkpointer(tmp_path, shared_memory=None, emergency_save=False) as restarted:  # after a crash
        restored = restarted.load_latest()
    assert restored is not None and restored.step == 12
    assert_state(restored.state, make_state(12))


def test_a_checkpoint_found_damaged_at_load_does_not_count(tmp_path: Path) -> None:
    with Checkpointer(tmp_path, shared_memory=None, emergency_save=False, keep_last=5) as checkpointer:
        for step in (10, 20):
            checkpointer.save(step, make_state(step))
    flip_byte(tmp_path / "step-000000000020" / "rank-00000.img", 5000)
    with Checkpointer(tmp_path, shared_memory=None, emergency_save=False, keep_last=2) as checkpointer:
        restored = checkpointer.load_latest()
        assert restored is not None and restored.step == 10
        for step in (11, 12, 13):
            checkpointer.save(step, make_state(step))
        checkpointer.wait()
    assert steps_on_disk(tmp_path) == [12, 13, 20]  # two good ones; the damaged one is not deleted either


@pytest.mark.parametrize("junk", [
    pytest.param({"rank-00000.json": b"junk", "rank-00000.img": b"junk"}, id="junk-files"),
    pytest.param({"rank-00000.json": b""}, id="empty-manifest"),
    pytest.param({}, id="empty-folder"),
])
def test_a_junk_step_folder_does_not_count_toward_keep_last(tmp_path: Path, junk: dict[str, bytes]) -> None:
    folder = tmp_path / "step-000000009999"
    folder.mkdir()
    for name, data in junk.items():
        (folder / name).write_bytes(data)
    with Checkpointer(tmp_path, shared_memory=None, emergency_save=False, keep_last=2) as checkpointer:
        for step in range(1, 6):
            checkpointer.save(step, {"x": torch.full((4,), float(step))})
        checkpointer.wait()
    assert [s for s in steps_on_disk(tmp_path) if s != 9999] == [4, 5]  # before: [5]
    with Checkpointer(tmp_path, shared_memory=None, emergency_save=False) as restarted:
        restored = restarted.load_latest()
    assert restored is not None and restored.step == 5


def test_a_manifest_whose_image_is_missing_does_not_count(tmp_path: Path) -> None:
    with Checkpointer(tmp_path, shared_memory=None, emergency_save=False, keep_last=2) as checkpointer:
        for step in (1, 2, 3):
            checkpointer.save(step, {"x": torch.full((4,), float(step))})
        checkpointer.wait()
        (tmp_path / "step-000000000003" / "rank-00000.img").write_bytes(b"truncated")
        checkpointer.save(4, {"x": torch.full((4,), 4.0)})
        checkpointer.wait()
    assert steps_on_disk(tmp_path) == [2, 3, 4]  # 2 and 4 loadable; 3's image has the wrong size
