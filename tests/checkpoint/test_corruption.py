"""Truncated, bit-flipped or half-deleted files are detected, skipped with a warning, and an older step served."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest
from tests.checkpoint.states import assert_state, make_state

from kcover.checkpoint import Checkpointer


def flip_bit(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset % len(data)] ^= 0x10
    path.write_bytes(bytes(data))


def truncate(path: Path, keep: float) -> None:
    path.write_bytes(path.read_bytes()[: int(path.stat().st_size * keep)])


def save_steps(directory: Path, *steps: int) -> None:
    with Checkpointer(directory, shared_memory=None, emergency_save=False, keep_last=5) as checkpointer:
        for step in steps:
            checkpointer.save(step, make_state(step))


def files(directory: Path, step: int) -> tuple[Path, Path]:
    folder = directory / f"step-{step:012d}"
    return folder / "rank-00000.img", folder / "rank-00000.json"


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        pytest.param(lambda img, man: flip_bit(img, 5000), "checksum mismatch in bytes 0–", id="bit-flip-in-tensor"),
        pytest.param(lambda img, man: flip_bit(img, -10), "checksum mismatch", id="bit-flip-in-skeleton"),
        pytest.param(lambda img, man: flip_bit(img, 13), "checksum mismatch", id="bit-flip-in-header"),
        pytest.param(lambda img, man: truncate(img, 0.5), "truncated", id="truncated-image"),
        pytest.param(lambda img, man: img.write_bytes(b""), "truncated", id="empty-image"),
        pytest.param(lambda img, man: img.unlink(), "No such file", id="image-missing"),
        pytest.param(lambda img, man: man.write_text(man.read_text().replace('"step": 3', '"step": 4')),
                     "unreadable manifest", id="manifest-edited"),
        pytest.param(lambda img, man: truncate(man, 0.7), "unreadable manifest", id="manifest-truncated"),
    ],
)
def test_a_damaged_newest_checkpoint_falls_back_to_the_previous_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: Callable[[Path, Path], None], reason: str
) -> None:
    save_steps(tmp_path, 2, 3)
    damage(*files(tmp_path, 3))
    with caplog.at_level(logging.WARNING, "kcover.checkpoint"), Checkpointer(
        tmp_path, shared_memory=None, emergency_save=False
    ) as checkpointer:
        restored = checkpointer.load_latest()
    assert restored is not None and restored.step == 2
    assert_state(restored.state, make_state(2))
    assert "skipping step 3" in caplog.text and reason in caplog.text


def test_a_flip_in_a_later_block_names_that_block(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with Checkpointer(tmp_path, shared_memory=None, emergency_save=False, block_size=4096) as checkpointer:
        checkpointer.save(1, make_state(1, scale=8))
    image, _ = files(tmp_path, 1)
    flip_bit(image, 3 * 4096 + 17)
    with caplog.at_level(logging.WARNING, "kcover.checkpoint"), Checkpointer(
        tmp_path, shared_memory=None, emergency_save=False
    ) as checkpointer:
        assert checkpointer.load_latest() is None
    assert "checksum mismatch in bytes 12288–16384" in caplog.text


def test_everything_damaged_means_no_checkpoint_not_a_wrong_one(tmp_path: Path) -> None:
    save_steps(tmp_path, 1, 2)
    for step in (1, 2):
        flip_bit(files(tmp_path, step)[0], 4200)
    with Checkpointer(tmp_path, shared_memory=None, emergency_save=False) as checkpointer:
        assert checkpointer.load_latest() is None


@pytest.mark.parametrize("memory_snapshots", [1, 2])
def test_a_torn_memory_snapshot_is_ignored_and_the_previous_one_or_the_disk_serves(
    tmp_path: Path, shm_dir: Path, memory_snapshots: int
) -> None:
    with Checkpointer(tmp_path, shared_memory=shm_dir, emergency_save=False,
                      memory_snapshots=memory_snapshots) as checkpointer:
        checkpointer.save(1, make_state(1))
        checkpointer.wait()
        checkpointer.save(2, make_state(2), persist=False)
    (snapshot,) = shm_dir.glob("*.img")
    data = bytearray(snapshot.read_bytes())
    data[12] = 1  # the state field back to WRITING: a writer died mid-copy
    snapshot.write_bytes(bytes(data))
    with Checkpointer(tmp_path, shared_memory=shm_dir, emergency_save=False,
                      memory_snapshots=memory_snapshots) as restarted:
        assert restarted.latest_step() == 1
        restored = restarted.load_latest()
        assert restored is not None
        if memory_snapshots == 2:  # the previous snapshot, in the .next file, is still whole
            assert (restored.step, restored.source) == (1, "memory") and restored.where.endswith(".img.next")
            for step in (3, 4):  # the restored tensors map that file: later snapshots must go elsewhere
                restarted.save(step, make_state(step), persist=False)
        else:
            assert (restored.step, restored.source) == (1, "disk")
    assert_state(restored.state, make_state(1))
