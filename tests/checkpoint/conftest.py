"""Fixtures of the checkpoint tests: a private shared-memory folder and states.

Leaked workers are caught by the suite-wide check in ``tests/conftest.py``.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

WORKERS = Path(__file__).parent / "workers"


@pytest.fixture
def shm_dir() -> Iterator[Path]:
    """A folder in /dev/shm of its own: real shared memory, nothing left behind."""
    folder = Path(tempfile.mkdtemp(prefix="kcover-test-", dir="/dev/shm"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)
