"""``KCOVER_SHARED_MEMORY`` moves the snapshots (on Kubernetes: a hostPath, so they outlive the pod)."""

from __future__ import annotations

import logging
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
