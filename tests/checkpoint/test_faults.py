"""Bad places to write: a full disk, a read-only or missing dir, full shared memory.

Training must go on (``save`` never raises for I/O), the error must be clear,
and the previous checkpoint must stay intact.  The full disk is a real 4 MiB
tmpfs (root may mount one; without root the tests are skipped, never faked).
"""

from __future__ import annotations

import contextlib
import logging
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from kcover.checkpoint import Checkpointer, CheckpointWriteError


@contextlib.contextmanager
def tmpfs(path: Path, options: str) -> Iterator[Path]:
    path.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True,
                             check=False)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


def mb(n: float) -> dict[str, torch.Tensor]:
    return {"x": torch.ones(int(n * (1 << 20)) // 4)}


def test_disk_full_is_reported_training_continues_and_the_previous_checkpoint_survives(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with tmpfs(tmp_path / "small", "size=4m") as small, Checkpointer(
        small, shared_memory=None, emergency_save=False
    ) as checkpointer:
        assert checkpointer.save(1, mb(1))
        checkpointer.wait()
        assert checkpointer.persisted_step == 1
        with caplog.at_level(logging.ERROR, "kcover.checkpoint"):
            assert checkpointer.save(2, mb(3.5))  # does not raise: the failure is in the background
            checkpointer.wait()
        assert isinstance(checkpointer.last_error, CheckpointWriteError)
        assert "No space left on device" in str(checkpointer.last_error)
        assert "step 2" in caplog.text and "earlier checkpoints are intact" in caplog.text
        assert checkpointer.persisted_step == 1
        assert not list(small.rglob("*.tmp"))  # the partial file is gone, the space is free again
        assert checkpointer.save(3, mb(1))  # and later saves still work
        checkpointer.wait()
        assert checkpointer.persisted_step == 3


def test_disk_full_leaves_step_1_loadable(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "small", "size=4m") as small:
        with Checkpointer(small, shared_memory=None, emergency_save=False) as checkpointer:
            checkpointer.save(1, mb(1))
            checkpointer.save(2, mb(3.5))
            checkpointer.wait()
            assert checkpointer.last_error is not None
        with Checkpointer(small, shared_memory=None, emergency_save=False) as restarted:
            restored = restarted.load_latest()
        assert restored is not None and restored.step == 1
        assert torch.equal(restored.state["x"], mb(1)["x"])


def test_read_only_dir_is_a_clear_error_and_training_continues(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "ro", "ro,size=1m") as read_only, Checkpointer(
        read_only / "ckpt", emergency_save=False, shared_memory=None
    ) as checkpointer:
        assert checkpointer.save(1, mb(0.1))
        checkpointer.wait()
        assert isinstance(checkpointer.last_error, CheckpointWriteError)
        assert "Read-only file system" in str(checkpointer.last_error)
        assert str(read_only / "ckpt") in str(checkpointer.last_error)
        assert checkpointer.load_latest() is None  # nothing was committed, nothing half-written is taken


def test_a_missing_dir_is_created(tmp_path: Path) -> None:
    with Checkpointer(tmp_path / "a" / "b" / "c", shared_memory=None, emergency_save=False) as checkpointer:
        checkpointer.save(1, mb(0.1))
        checkpointer.wait()
        assert checkpointer.last_error is None
    assert (tmp_path / "a" / "b" / "c" / "step-000000000001" / "rank-00000.json").is_file()


def test_a_file_where_the_dir_should_be_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a dir")
    with Checkpointer(tmp_path / "file" / "ckpt", shared_memory=None, emergency_save=False) as checkpointer:
        checkpointer.save(1, mb(0.1))
        checkpointer.wait()
    assert isinstance(checkpointer.last_error, CheckpointWriteError)
    assert "Not a directory" in str(checkpointer.last_error)


def test_full_shared_memory_falls_back_to_private_memory(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with tmpfs(tmp_path / "shm", "size=1m") as shm, caplog.at_level(logging.WARNING, "kcover.checkpoint"):
        with Checkpointer(tmp_path / "ckpt", shared_memory=shm, emergency_save=False) as checkpointer:
            assert checkpointer.save(1, mb(2))
            checkpointer.wait()
            assert checkpointer.persisted_step == 1 and checkpointer.last_error is None
            restored = checkpointer.load_latest()
        assert "cannot reserve" in caplog.text and "private memory" in caplog.text
        assert not list(shm.iterdir())  # no half-reserved file left in shared memory
    assert restored is not None and restored.source == "disk" and torch.equal(restored.state["x"], mb(2)["x"])
