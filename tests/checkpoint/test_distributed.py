"""Sharded state across ranks: ranks agree on one step, and a changed world size is handled as documented."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tests.checkpoint.conftest import WORKERS

from kcover.checkpoint import Checkpointer, WorldSizeChangedError


def test_ranks_agree_on_the_newest_step_every_rank_can_load(tmp_path: Path) -> None:
    store = tmp_path / "store"
    ranks = [subprocess.Popen([sys.executable, str(WORKERS / "agree.py"), str(tmp_path / "ckpt"), str(r), str(store)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    outputs = [rank.communicate(timeout=90) for rank in ranks]
    for rank, (stdout, stderr) in zip(ranks, outputs, strict=True):
        assert rank.returncode == 0, stderr
        assert stdout.strip() == "restored 1 disk"  # rank 0's step 2 is fine, but rank 1's is not
    assert "skipping step 2" in outputs[1][1] and "checksum mismatch" in outputs[1][1]


def save_two_ranks(directory: Path, replicated: bool) -> None:
    for rank in (0, 1):
        with Checkpointer(directory, rank=rank, world_size=2, replicated=replicated, shared_memory=None,
                          emergency_save=False) as checkpointer:
            checkpointer.save(5, {"shard": torch.full((3,), float(rank))})


def test_sharded_state_refuses_a_different_world_size(tmp_path: Path) -> None:
    save_two_ranks(tmp_path, replicated=False)
    with Checkpointer(tmp_path, rank=0, world_size=1, shared_memory=None, emergency_save=False) as shrunk:
        assert shrunk.latest_step() is None
        with pytest.raises(WorldSizeChangedError, match="saved by 2 ranks, this job has 1"):
            shrunk.load_latest()


def test_replicated_state_loads_after_the_world_shrinks_or_grows(tmp_path: Path) -> None:
    save_two_ranks(tmp_path, replicated=True)
    with Checkpointer(tmp_path, rank=0, world_size=1, replicated=True, shared_memory=None,
                      emergency_save=False) as shrunk:
        restored = shrunk.load_latest()
    assert restored is not None and torch.equal(restored.state["shard"], torch.zeros(3))
    with Checkpointer(tmp_path, rank=3, world_size=4, replicated=True, shared_memory=None,
                      emergency_save=False) as grown:
        restored = grown.load_latest()  # rank 3 never saved: it takes the lowest rank's replica
    assert restored is not None and restored.step == 5 and torch.equal(restored.state["shard"], torch.zeros(3))


def test_dtensor_state_is_saved_as_local_shards_and_copied_back(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(WORKERS / "dtensor.py"), str(tmp_path)], capture_output=True, text=True,
                          timeout=90, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_copy_into_refuses_a_shape_mismatch() -> None:
    from kcover.checkpoint import copy_into

    live = {"w": torch.zeros(2, 3)}
    with pytest.raises(ValueError, match=r"into a tensor of shape \(2, 3\)"):
        copy_into(live, {"w": torch.zeros(3, 2)})
    assert copy_into(live, {"w": torch.ones(2, 3)}) == 1 and torch.equal(live["w"], torch.ones(2, 3))
