"""Suite-wide fixtures: no test may leave a process behind.

Every process this test session starts inherits ``KCOVER_TEST_SESSION``; after
each test, any process carrying this session's value that did not exist before
the test (the session's own test-cluster components excepted) is a leak: it is
killed and the test fails.  Other sessions on the same machine are never
touched, and workers orphaned by a crashed launcher are still found.

``kcover run`` keeps each simulated node's memory in ``/dev/shm/kcover-nodes-*``
and leaves it for the job's next run when it is killed; the tests that kill it
do so on purpose, so the session removes the folders it created when it ends.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from kcover.testing.binaries import OPTIONAL, REQUIRED

pytest_plugins = ["kcover.testing.fixtures"]

SESSION = os.environ.setdefault("KCOVER_TEST_SESSION", uuid.uuid4().hex)
CLUSTER_PROGRAMS = frozenset(REQUIRED + OPTIONAL)


def _session_processes() -> dict[int, psutil.Process]:
    found = {}
    me = os.getpid()
    for process in psutil.process_iter(["pid", "name"]):
        if process.pid == me or process.info["name"] in CLUSTER_PROGRAMS:
            continue
        try:
            if process.environ().get("KCOVER_TEST_SESSION") == SESSION and process.status() != psutil.STATUS_ZOMBIE:
                found[process.pid] = process
        except (psutil.Error, OSError):
            continue
    return found


@pytest.fixture(autouse=True)
def no_leftover_processes() -> Iterator[None]:
    """Fail any test that leaves a process of this session running, and clean up after it."""
    before = set(_session_processes())
    yield
    leaked = [p for pid, p in _session_processes().items() if pid not in before]
    names = []
    for process in leaked:
        try:
            names.append(" ".join(process.cmdline()))
            process.kill()
        except psutil.Error:
            continue
    assert not names, f"test left processes behind: {names}"


@pytest.fixture(autouse=True, scope="session")
def no_leftover_node_memory() -> Iterator[None]:
    """Remove the simulated nodes' memory folders this session created in /dev/shm."""
    shm = Path("/dev/shm")
    before = set(shm.glob("kcover-nodes-*"))
    yield
    for folder in set(shm.glob("kcover-nodes-*")) - before:
        shutil.rmtree(folder, ignore_errors=True)
