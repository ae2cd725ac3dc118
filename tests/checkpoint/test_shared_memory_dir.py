"""``KCOVER_SHARED_MEMORY`` moves the snapshots (on Kubernetes: a hostPath, so they outlive the pod)."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import pytest
from tests.checkpoint.states import assert_state, make_state

from kcover.checkpoint import Checkpointer, remove_snapshots


def test_the_environment_names_the_snapshot_folder(tmp_path: Path, shm_dir: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KCOVER_SHARED_MEMORY", str(shm_dir))
    with Checkpointer(tmp_path, rank=0, world_size=1, emergency_save=False) as checkpointer:
        checkpointer.save(3, make_state(3), persist=False)
    assert [p.name.endswith("-rank00000.img") for p in shm_dir.iterdir()] == [True]
    with Checkpointer(tmp_path, rank=0, world_size=1, emergency_save=False) as restarted:  # a new pod, same node
        restored = restarted.load_latest()
        assert restored is not None and (restored.step, restored.source) == (3, "memory")
        assert_state(restored.state, make_state(3))
        del restored
    assert len(remove_snapshots(tmp_path)) == 1 and not list(shm_dir.iterdir())


def test_a_missing_snapshot_folder_is_said_and_the_disk_still_works(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("KCOVER_SHARED_MEMORY", str(tmp_path / "not-mounted"))
    with caplog.at_level(logging.WARNING, "kcover"), \
            Checkpointer(tmp_path / "ckpt", rank=0, world_size=1, emergency_save=False) as checkpointer:
        checkpointer.save(1, make_state(1))
        assert checkpointer.wait(timeout=30) and checkpointer.last_error is None
    assert f"shared-memory folder {tmp_path / 'not-mounted'} does not exist" in caplog.text
    with Checkpointer(tmp_path / "ckpt", rank=0, world_size=1, emergency_save=False) as restarted:
        restored = restarted.load_latest()
        assert restored is not None and (restored.step, restored.source) == (1, "disk")


def test_every_save_stamps_the_snapshot_and_a_swept_one_comes_back(tmp_path: Path, shm_dir: Path) -> None:
    """The node agent deletes snapshot files no job saved for long; a live writer recovers on its next save."""
    with Checkpointer(tmp_path, shared_memory=shm_dir, rank=0, world_size=1, emergency_save=False) as checkpointer:
        checkpointer.save(1, make_state(1), persist=False)
        (snapshot,) = shm_dir.glob("*.img")  # the .next file is being reserved meanwhile
        os.utime(snapshot, (1_000_000_000, 1_000_000_000))
        checkpointer.save(2, make_state(2), persist=False)  # the committed snapshot at that name is stamped
        assert time.time() - snapshot.stat().st_mtime < 60
        snapshot.unlink()  # what the agent's sweep does
        checkpointer.save(3, make_state(3), persist=False)  # not into the deleted file: a new one at the name
        assert snapshot.exists()
    with Checkpointer(tmp_path, shared_memory=shm_dir, rank=0, world_size=1, emergency_save=False) as restarted:
        restored = restarted.load_latest()
        assert restored is not None and (restored.step, restored.source) == (3, "memory")
        assert_state(restored.state, make_state(3))
        del restored
