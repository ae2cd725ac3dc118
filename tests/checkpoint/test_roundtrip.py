"""A saved state comes back equal — from shared memory and from disk — or is refused at save time."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from tests.checkpoint.states import assert_state, make_state

from kcover.checkpoint import Checkpointer, CheckpointError


def test_nested_state_round_trips_through_memory_and_disk(tmp_path: Path, shm_dir: Path) -> None:
    state = make_state(7)
    with Checkpointer(tmp_path, shared_memory=shm_dir, emergency_save=False) as checkpointer:
        assert checkpointer.latest_step() is None
        assert checkpointer.load_latest() is None
        assert checkpointer.save(7, state)
        assert checkpointer.wait(timeout=30)
        assert checkpointer.last_error is None and checkpointer.persisted_step == 7
        restored = checkpointer.load_latest()
    assert restored is not None and (restored.step, restored.source) == (7, "memory")
    assert_state(restored.state, state)
    with Checkpointer(tmp_path, shared_memory=None, emergency_save=False) as from_disk:
        assert from_disk.latest_step() == 7
        restored = from_disk.load_latest()
    assert restored is not None and (restored.step, restored.source) == (7, "disk")
    assert_state(restored.state, state)


def test_a_restarted_worker_restores_from_memory_and_its_views_survive_the_next_save(
    tmp_path: Path, shm_dir: Path
) -> None:
    with Checkpointer(tmp_path, shared_memory=shm_dir, emergency_save=False) as first:
        first.save(1, make_state(1), persist=False)  # memory only: newer than anything on disk
    with Checkpointer(tmp_path, shared_memory=shm_dir, emergency_save=False) as restarted:
        assert restarted.latest_step() == 1
        restored = restarted.load_latest()
        assert restored is not None and (restored.step, restored.source) == (1, "memory")
        restored.state["model"]["bias"].add_(100)  # writes stay private (copy-on-write)
        restarted.save(2, make_state(2))  # must not overwrite the restored tensors' memory
        restarted.wait()
        assert_state(restored.state["model"]["weight"], make_state(1)["model"]["weight"])
        assert torch.equal(restored.state["model"]["bias"], torch.full((32,), 101.0))
        again = restarted.load_latest()
    assert again is not None and again.step == 2
    assert_state(again.state, make_state(2))
    (snapshot,) = shm_dir.glob("*.img")  # the newest, and the one before it: nothing else left
    assert sorted(p.name for p in shm_dir.iterdir()) == [snapshot.name, snapshot.name + ".next"]


def test_tied_non_contiguous_and_odd_tensors(tmp_path: Path) -> None:
    shared = torch.randn(5, 4)
    state = {"a": shared, "b": shared, "t": torch.randn(6, 3).t(), "c": torch.randn(3, dtype=torch.complex64),
             "slice": torch.arange(100)[10:20:3], "tuple": (1, 2.5, None, "x", b"raw")}
    with Checkpointer(tmp_path, shared_memory=None, emergency_save=False) as checkpointer:
        checkpointer.save(3, state)
        restored = checkpointer.load_latest(device="cpu")
    assert restored is not None
    assert restored.state["a"] is restored.state["b"]  # tied weights stay tied
    assert torch.equal(restored.state["t"], state["t"]) and restored.state["t"].is_contiguous()
    assert torch.equal(restored.state["c"], state["c"])
    assert torch.equal(restored.state["slice"], state["slice"])
    assert restored.state["tuple"] == state["tuple"]


class Opaque:
    def __init__(self) -> None:
        self.value = 3


def test_an_arbitrary_object_is_refused_at_save_time_unless_trusted(tmp_path: Path) -> None:
    with Checkpointer(tmp_path / "a", shared_memory=None, emergency_save=False) as checkpointer:
        with pytest.raises(CheckpointError, match=r"Opaque, which is not a plain Python value.*trusted=True"):
            checkpointer.save(1, {"x": Opaque()})
        assert checkpointer.latest_step() is None
    with Checkpointer(tmp_path / "b", shared_memory=None, emergency_save=False, trusted=True) as trusting:
        trusting.save(1, {"x": Opaque()})
        restored = trusting.load_latest()
    assert restored is not None and restored.state["x"].value == 3


def test_sparse_and_unpicklable_states_are_refused(tmp_path: Path) -> None:
    with Checkpointer(tmp_path, shared_memory=None, emergency_save=False) as checkpointer:
        with pytest.raises(CheckpointError, match="only dense"):
            checkpointer.save(1, {"s": torch.eye(3).to_sparse()})
        with pytest.raises(CheckpointError, match="only dense"):
            checkpointer.save(1, {"m": torch.empty(3, device="meta")})
        with pytest.raises(CheckpointError, match="cannot be pickled"):
            checkpointer.save(1, {"f": lambda: 1})


def test_no_dir_means_kcover_checkpoint_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KCOVER_CHECKPOINT_DIR", raising=False)
    with pytest.raises(CheckpointError, match="KCOVER_CHECKPOINT_DIR"):
        Checkpointer()
    monkeypatch.setenv("KCOVER_CHECKPOINT_DIR", str(tmp_path / "from-env"))
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    with Checkpointer(shared_memory=None, emergency_save=False) as checkpointer:
        assert (checkpointer.directory, checkpointer.rank, checkpointer.world_size) == (tmp_path / "from-env", 3, 4)
        checkpointer.save(1, {"x": torch.ones(2)})
    assert (tmp_path / "from-env" / "step-000000000001" / "rank-00003.json").is_file()


def test_a_recreated_dir_does_not_restore_the_old_jobs_memory_snapshot(tmp_path: Path, shm_dir: Path) -> None:
    with Checkpointer(tmp_path / "ckpt", shared_memory=shm_dir, emergency_save=False) as old:
        old.save(9, make_state(9))
    for path in sorted((tmp_path / "ckpt").rglob("*"), reverse=True):
        path.unlink() if path.is_file() else path.rmdir()
    with Checkpointer(tmp_path / "ckpt", shared_memory=shm_dir, emergency_save=False) as fresh:
        assert fresh.latest_step() is None
        assert fresh.load_latest() is None


def test_reserve_prepares_the_buffer_in_the_background(tmp_path: Path, shm_dir: Path) -> None:
    state = make_state(1, scale=16)
    with Checkpointer(tmp_path, shared_memory=shm_dir, emergency_save=False) as checkpointer:
        checkpointer.reserve(state)
        deadline = time.monotonic() + 10
        while not [p for p in shm_dir.glob("*.next") if p.stat().st_size] and time.monotonic() < deadline:
            time.sleep(0.01)
        (prepared,) = shm_dir.glob("*.next")
        size, inode = prepared.stat().st_size, prepared.stat().st_ino
        checkpointer.save(1, state)
        (snapshot,) = shm_dir.glob("*.img")  # the prepared file became the snapshot: nothing allocated twice
        assert snapshot.stat().st_size == size and snapshot.stat().st_ino == inode
        # the file for the next snapshot is reserved in the background too: the second save allocates nothing
        spare = snapshot.with_name(snapshot.name + ".next")
        while not (spare.exists() and spare.stat().st_size == size) and time.monotonic() < deadline:
            time.sleep(0.01)
        second = spare.stat().st_ino
        checkpointer.save(2, state)
        assert snapshot.stat().st_ino == second and spare.stat().st_ino == inode  # the two files swapped names
