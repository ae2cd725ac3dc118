"""Freeing node memory: the agent removes memory snapshots that no job has refreshed for a long time.

On Kubernetes the trainers keep their checkpoint snapshots in a tmpfs folder of
the node (a hostPath, ``KCOVER_SHARED_MEMORY``), so that a restarted pod on the
same node restores from memory.  Those files outlive their job: nothing else
would ever free that memory.  Every save touches its snapshot file
(:meth:`kcover.checkpoint.snapshot.SnapshotBuffer.touch`), so a file whose
modification time is older than ``max_age`` belongs to a job that stopped
saving: the agent deletes it.  A job that is still running keeps its mapping
(deleting a name never takes memory from under a process); at worst its next
restart reads the disk instead.  Started by ``kcover agent --snapshot-dir``.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from pathlib import Path

log = logging.getLogger("kcover.agent.snapshots")

PATTERNS = ("kcover-*.img", "kcover-*.img.next")  # committed snapshots, and buffers a killed writer left
SWEEP_SECONDS = 300.0


def sweep(folder: Path, max_age: float, now: float | None = None) -> list[Path]:
    """Delete the snapshot files in ``folder`` not modified for ``max_age`` seconds; the paths deleted."""
    now = time.time() if now is None else now
    removed = []
    for pattern in PATTERNS:
        for path in folder.glob(pattern):
            with contextlib.suppress(FileNotFoundError):
                if now - path.stat().st_mtime > max_age:
                    path.unlink()
                    removed.append(path)
    return removed


def sweep_forever(folder: Path, max_age: float, stop: threading.Event, every: float = SWEEP_SECONDS) -> None:
    while not stop.is_set():
        try:
            for path in sweep(folder, max_age):
                log.info("removed the memory snapshot %s: not saved for more than %.0f s", path, max_age)
        except OSError as exc:
            log.warning("sweeping memory snapshots in %s: %s", folder, exc)
        stop.wait(every)
