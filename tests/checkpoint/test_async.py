"""Saving is asynchronous: a busy persist makes the next save wait or skip, and ETTR hears of each checkpoint."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from kcover.checkpoint import Checkpointer, disk


@pytest.fixture
def slow_disk(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Persisting blocks until the returned event is set (the real write follows)."""
    release = threading.Event()
    real = disk.persist

    def persist(*args: Any, **kwargs: Any) -> Any:
        release.wait(30)
        return real(*args, **kwargs)

    monkeypatch.setattr(disk, "persist", persist)
    return release


def test_save_returns_before_the_disk_write_and_skip_policy_skips(tmp_path: Path, slow_disk: threading.Event) -> None:
    with Checkpointer(tmp_path, shared_memory=None, emergency_save=False, if_busy="skip") as checkpointer:
        assert checkpointer.save(1, {"x": torch.ones(3)})
        assert checkpointer.busy and checkpointer.persisted_step is None
        assert not checkpointer.save(2, {"x": torch.ones(3)})  # skipped: step 1 still in flight
        assert checkpointer.skipped == 1
        slow_disk.set()
        assert checkpointer.wait(timeout=30)
        assert checkpointer.persisted_step == 1
        assert checkpointer.save(3, {"x": torch.ones(3)})
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-000000000001", "step-000000000003"]


def test_wait_policy_blocks_the_next_save_until_the_persist_is_done(
    tmp_path: Path, slow_disk: threading.Event
) -> None:
    with Checkpointer(tmp_path, shared_memory=None, emergency_save=False) as checkpointer:
        checkpointer.save(1, {"x": torch.ones(3)})
        threading.Timer(0.3, slow_disk.set).start()
        began = time.monotonic()
        assert checkpointer.save(2, {"x": torch.full((3,), 2.0)})
        assert time.monotonic() - began >= 0.25
        checkpointer.wait()
        assert checkpointer.persisted_step == 2


def test_the_snapshot_is_taken_at_save_time_not_at_persist_time(tmp_path: Path, slow_disk: threading.Event) -> None:
    live = torch.zeros(1000)
    with Checkpointer(tmp_path, shared_memory=None, emergency_save=False) as checkpointer:
        checkpointer.save(1, {"w": live})
        live.add_(5)  # training goes on while the write is pending
        slow_disk.set()
        checkpointer.wait()
    with Checkpointer(tmp_path, shared_memory=None, emergency_save=False) as restarted:
        restored = restarted.load_latest()
    assert restored is not None and torch.equal(restored.state["w"], torch.zeros(1000))


def test_each_persisted_checkpoint_is_reported_to_kcover_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    read, write = os.pipe()
    monkeypatch.setenv("KCOVER_PROGRESS_FD", str(write))
    try:
        with Checkpointer(tmp_path, shared_memory=None, emergency_save=False) as checkpointer:
            checkpointer.save(4, {"x": torch.ones(2)})
            checkpointer.save(8, {"x": torch.ones(2)}, persist=False)  # memory only: not a checkpoint yet
            checkpointer.wait()
        os.close(write)
        assert os.read(read, 100) == b"ckpt 4\n"
    finally:
        os.close(read)


def test_an_interpreter_exiting_normally_finishes_the_persist_in_flight(tmp_path: Path) -> None:
    import subprocess
    import sys

    script = ("import torch; from kcover.checkpoint import Checkpointer; "
              f"c = Checkpointer({str(tmp_path)!r}, shared_memory=None); c.save(5, {{'x': torch.ones(1 << 20)}})")
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    with Checkpointer(tmp_path, shared_memory=None, emergency_save=False) as checkpointer:
        restored = checkpointer.load_latest()
    assert restored is not None and restored.step == 5
