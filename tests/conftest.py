"""Suite-wide fixtures: no test may leave a process behind."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

pytest_plugins = ["kcover.testing.fixtures"]

MARKERS = ("tests/launcher/workers/", "kcover/demo/train", "-m kcover run", "kcover run")


def _leftovers() -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter(["pid", "cmdline"]):
        cmdline = " ".join(process.info["cmdline"] or [])
        if any(marker in cmdline for marker in MARKERS) and process.pid != psutil.Process().pid:
            found.append(process)
    return found


@pytest.fixture(autouse=True)
def no_leftover_processes() -> Iterator[None]:
    """Fail any test that leaves a worker (or a kcover run) running, and clean up after it."""
    before = {p.pid for p in _leftovers()}
    yield
    leaked = [p for p in _leftovers() if p.pid not in before]
    leaked = [p for p in leaked if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    for process in leaked:
        process.kill()
    assert not leaked, f"test left processes behind: {[' '.join(p.info['cmdline']) for p in leaked]}"


@pytest.fixture
def workers_dir() -> Path:
    return Path(__file__).parent / "launcher" / "workers"
