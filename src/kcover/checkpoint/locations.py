"""Where a job's checkpoints live besides its dir: the snapshot files in shared memory, and the dir's id.

:func:`snapshot_path` names a rank's snapshot after a digest of the checkpoint
dir (or ``job_id``), so a restarted worker finds its predecessor's;
:func:`shared_memory_dir` resolves the default folder (``KCOVER_SHARED_MEMORY``,
e.g. a per-node hostPath on Kubernetes, else ``/dev/shm``);
:func:`remove_snapshots` deletes a finished job's snapshots and the replicas it
kept for its peers; :func:`dir_token` is the random id stored in the dir, so a
snapshot taken for a deleted and recreated dir is never restored into it.
Used by :class:`~kcover.checkpoint.checkpointer.Checkpointer`.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import secrets
from pathlib import Path

from kcover.checkpoint.files import read_small

log = logging.getLogger("kcover.checkpoint")
DEFAULT_SHARED_MEMORY = "/dev/shm"


def shared_memory_dir(given: str | os.PathLike[str] | None) -> Path | None:
    """Where snapshots go: ``given``; for the default, ``KCOVER_SHARED_MEMORY`` when set (e.g. a hostPath on
    Kubernetes, so that a snapshot outlives its pod)."""
    if given is None:
        return None
    if str(given) == DEFAULT_SHARED_MEMORY:
        return Path(os.environ.get("KCOVER_SHARED_MEMORY") or DEFAULT_SHARED_MEMORY)
    return Path(given)


def snapshot_path(shared_memory: Path, directory: Path, rank: int, job_id: str | None = None) -> Path:
    """The shared-memory file of ``rank``'s snapshot: stable across restarts of the same job."""
    digest = hashlib.sha1((job_id or str(directory.absolute())).encode()).hexdigest()[:16]
    return shared_memory / f"kcover-{digest}-rank{rank:05d}.img"


def remove_snapshots(directory: str | os.PathLike[str], shared_memory: str | os.PathLike[str] = DEFAULT_SHARED_MEMORY,
                     job_id: str | None = None) -> list[Path]:
    """Delete every rank's shared-memory snapshot of a job (call when the job is finished)."""
    folder = shared_memory_dir(shared_memory) or Path(DEFAULT_SHARED_MEMORY)
    example = snapshot_path(folder, Path(directory), 0, job_id)
    prefix = example.name[: -len("00000.img")]
    removed = []
    for path in [*folder.glob(prefix + "*.img"), *folder.glob(prefix + "*.img.next")]:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            removed.append(path)
    return removed


def read_token(path: Path) -> str:
    """The dir's id; raises OSError (FileNotFoundError when there is none) or ValueError (damaged)."""
    text = read_small(path, 256).decode("ascii").strip()
    if not text or not text.isalnum():
        raise ValueError("not an id")
    return text


def dir_token(directory: Path) -> str:
    """A random id stored in the dir: a snapshot taken for a deleted and recreated dir is not restored.

    A damaged id file (not a regular file, not an id) is left as it is, with a warning; the token is then
    empty, so snapshots are matched to the dir by its path only.
    """
    path = directory / ".kcover-id"
    try:
        with contextlib.suppress(FileNotFoundError, NotADirectoryError, PermissionError):
            return read_token(path)
        directory.mkdir(parents=True, exist_ok=True)
        token = secrets.token_hex(8)
        # named by the token, not the pid: ranks in containers share pids (pid 1 in each pod), and one rank
        # removed the other's file before it was linked, leaving that rank without the dir's id
        partial = directory / f".kcover-id.{token}.tmp"
        partial.write_text(token)
        with contextlib.suppress(FileExistsError):
            os.link(partial, path)  # create-if-absent, atomically: concurrent ranks agree on one token
        partial.unlink()
        return read_token(path)
    except (OSError, ValueError) as exc:
        if not isinstance(exc, OSError) or path.is_symlink() or path.exists():
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else "not an id"
            log.warning("kcover checkpoint: ignoring %s: %s", path, why)
        return ""
