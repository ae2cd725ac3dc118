"""Each simulated node's shared memory: a folder of its own, emptied when the node is lost.

On a real cluster a node's ``/dev/shm`` dies with the node; on one machine
every worker would otherwise share it, and a rank moved to a spare node would
find its old snapshot there as if nothing had happened.  ``kcover run`` gives
every simulated node ``<shm>/kcover-nodes-<run>/<node>`` (``<shm>`` is
``KCOVER_SHARED_MEMORY`` when set, else ``/dev/shm``; ``<run>`` is a digest of
the state dir, so a later run of the same job finds its snapshots) as the
workers' ``KCOVER_SHARED_MEMORY``, and empties a node's folder when the node
leaves the job (blamed and replaced by a spare, or dropped).  When the run
succeeds the whole folder goes (a finished job holds no memory); otherwise only
its empty folders do, and the snapshots wait for the next run of the job.  Snapshots of
ranks on that node must then come from a peer's replica or from the disk, as
they would on a cluster.  Called by :mod:`~kcover.launcher.spec` and
:mod:`~kcover.launcher.supervisor`.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
from collections.abc import Mapping
from pathlib import Path


def memory_root(state_dir: Path, env: Mapping[str, str] = os.environ) -> Path | None:
    """The folder holding every simulated node's shared memory; None where there is none that can be
    written (the workers then get ``KCOVER_SHARED_MEMORY`` as it was, and the Checkpointer says so)."""
    base = Path(env.get("KCOVER_SHARED_MEMORY") or "/dev/shm").absolute()
    digest = hashlib.sha1(os.fsencode(state_dir.resolve())).hexdigest()[:12]  # any bytes a path may hold
    root = base / f"kcover-nodes-{digest}"
    try:
        if base.is_dir():
            root.mkdir(exist_ok=True)
            return root if root.is_dir() and os.access(root, os.W_OK) else None
    except OSError:
        pass
    return None


def node_memory(root: Path, node: str) -> Path | None:
    """``node``'s shared-memory folder, created if missing; None if it cannot be."""
    folder = root / node
    try:
        folder.mkdir(exist_ok=True)
    except OSError:
        return None
    return folder


def forget_node(root: Path | None, node: str) -> None:
    """``node`` left the job: what its memory held is gone."""
    if root is not None:
        shutil.rmtree(root / node, ignore_errors=True)


def tidy(root: Path | None, finished: bool) -> None:
    """At the run's end: everything if the job ``finished``, else only empty folders."""
    if root is None:
        return
    if finished:
        shutil.rmtree(root, ignore_errors=True)
        return
    for folder in [*sorted(root.glob("*")), root]:
        with contextlib.suppress(OSError):
            folder.rmdir()  # only if empty
