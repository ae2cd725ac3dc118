"""Retention keeps the last N and every K-th step, deletes only this rank's files, and cleans up after kills."""

from __future__ import annotations

from pathlib import Path

import torch

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
        ".kcover-id", "step-000000000005", "step-000000000010", "step-000000000011", "step-000000000012"]


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
