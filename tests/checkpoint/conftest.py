"""Fixtures of the checkpoint tests: a private shared-memory folder, states, and no leaked workers.

Workers of these tests live in ``tests/checkpoint/workers/``; the suite-wide
leak check knows the launcher's workers only, so this one adds ours.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

WORKERS = Path(__file__).parent / "workers"
MARKER = "tests/checkpoint/workers/"


def _ours() -> set[int]:
    found = set()
    for process in psutil.process_iter(["pid", "cmdline"]):
        if MARKER in " ".join(process.info["cmdline"] or []):
            found.add(process.pid)
    return found


@pytest.fixture(autouse=True)
def no_leftover_checkpoint_workers() -> Iterator[None]:
    before = _ours()
    yield
    leaked = []
    for pid in _ours() - before:
        with pytest.MonkeyPatch.context():
            try:
                process = psutil.Process(pid)
                if process.status() != psutil.STATUS_ZOMBIE:
                    leaked.append(" ".join(process.cmdline()))
                    process.kill()
            except psutil.Error:
                continue
    assert not leaked, f"test left checkpoint workers behind: {leaked}"


@pytest.fixture
def shm_dir() -> Iterator[Path]:
    """A folder in /dev/shm of its own: real shared memory, nothing left behind."""
    folder = Path(tempfile.mkdtemp(prefix="kcover-test-", dir="/dev/shm"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)
