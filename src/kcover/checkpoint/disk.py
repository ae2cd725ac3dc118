"""Checkpoints on disk: write never torn, read only when verified, prune by retention.

Layout, one folder per step, one image and one manifest per rank::

    <dir>/step-000000001200/rank-00003.img    the snapshot image, byte for byte
    <dir>/step-000000001200/rank-00003.json   the manifest: committing = renaming it into place

:func:`persist` writes the image to a temporary name with large sequential
``write`` calls straight from the snapshot buffer (CRC-32 of each block is
computed on a second thread meanwhile), ``fsync``s it, renames it, then writes,
``fsync``s and renames the manifest and ``fsync``s the folders.  A crash at any
point leaves either the old set of checkpoints or the old set plus the new one.
:func:`read_verified` checks the size and every block's checksum before handing
the bytes over.  Each rank only ever deletes its own files, so ranks sharing a
folder never race on deletion.  :func:`prune` counts only checkpoints that can
be loaded (:func:`looks_loadable`: a sound manifest, an image of its size) and
never deletes the ones the caller protects; nothing is followed through a
symlink and only regular files are read (:mod:`~kcover.checkpoint.files`).
Called by the Checkpointer's background thread (writes) and by its
``load_latest`` (reads).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import time
from collections.abc import Collection, Iterator
from pathlib import Path

import torch

from kcover.checkpoint.checksums import Checksums
from kcover.checkpoint.errors import CheckpointWriteError, CorruptCheckpointError
from kcover.checkpoint.files import open_regular, read_small, regular_size
from kcover.checkpoint.landing import landing_buffer
from kcover.checkpoint.manifest import Manifest

MANIFEST_LIMIT = 64 << 20  # 5 million block checksums; a manifest is read only up to this size

_STEP_DIR = re.compile(r"step-(\d{12})")
_RANK_FILE = re.compile(r"rank-(\d{5})\.json")


def step_dir(root: Path, step: int) -> Path:
    return root / f"step-{step:012d}"


def _stem(rank: int) -> str:
    return f"rank-{rank:05d}"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data: memoryview) -> None:
    while data:
        written = os.write(fd, data)
        data = data[written:]


def _create(path: Path) -> int:
    """Create ``path`` and its folder.  Another rank may remove the folder while it is empty (pruning), so a
    vanished folder is made again; once our file is in it, nobody removes it."""
    for _ in range(10):
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        except FileNotFoundError:
            continue
    raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(path.parent))


def _write_file(path: Path, data: memoryview, block_size: int) -> list[int]:
    """Write ``data`` to a new file at ``path`` and fsync it; returns per-block CRC-32s."""
    fd = _create(path)
    try:
        try:
            os.posix_fallocate(fd, 0, max(len(data), 1))  # ENOSPC now, not after writing gigabytes
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                raise
        checksums = Checksums()
        try:
            for start in range(0, len(data), block_size):
                block = data[start : start + block_size]
                checksums.add(block)
                _write_all(fd, block)
        finally:
            crcs = checksums.finish()
        os.fsync(fd)
    finally:
        os.close(fd)
    return crcs


def persist(
    root: Path, data: memoryview, step: int, rank: int, world_size: int, replicated: bool, block_size: int
) -> Manifest:
    """Write and commit one rank's image of ``step``; raises :class:`CheckpointWriteError`, leaving nothing."""
    folder = step_dir(root, step)
    image_tmp, manifest_tmp = folder / f".{_stem(rank)}.img.tmp", folder / f".{_stem(rank)}.json.tmp"
    try:
        new_folder = not folder.is_dir()
        crcs = _write_file(image_tmp, data, block_size)
        os.replace(image_tmp, folder / f"{_stem(rank)}.img")
        manifest = Manifest(step, rank, world_size, replicated, f"{_stem(rank)}.img", len(data), block_size,
                            tuple(crcs), time.time())
        _write_small(manifest_tmp, manifest.to_json())
        os.replace(manifest_tmp, folder / f"{_stem(rank)}.json")
        _fsync_dir(folder)
        if new_folder:
            _fsync_dir(root)
    except OSError as exc:
        for leftover in (image_tmp, manifest_tmp):
            with contextlib.suppress(OSError):
                leftover.unlink()
        raise CheckpointWriteError(
            f"cannot write checkpoint of step {step} (rank {rank}) to {folder}: {exc.strerror or exc}"
        ) from exc
    return manifest


def _write_small(path: Path, data: bytes) -> None:
    fd = _create(path)
    try:
        _write_all(fd, memoryview(data))
        os.fsync(fd)
    finally:
        os.close(fd)


def _step_folders(root: Path) -> Iterator[tuple[int, Path]]:
    """``(step, folder)`` of every step folder — real folders only: a symlink is never followed."""
    with contextlib.suppress(OSError):
        for entry in os.scandir(root):
            match = _STEP_DIR.fullmatch(entry.name)
            with contextlib.suppress(OSError):
                if match and entry.is_dir(follow_symlinks=False):
                    yield int(match.group(1)), Path(entry.path)


def committed_steps(root: Path, rank: int | None) -> dict[int, list[int]]:
    """Steps with a manifest in place → the ranks that have one (``rank`` None: all ranks). Not verified."""
    found: dict[int, list[int]] = {}
    for step, folder in _step_folders(root):
        with contextlib.suppress(OSError):
            for name in os.listdir(folder):
                file = _RANK_FILE.fullmatch(name)
                if file and (rank is None or int(file.group(1)) == rank):
                    found.setdefault(step, []).append(int(file.group(1)))
    return {step: sorted(ranks) for step, ranks in found.items()}


def read_manifest(root: Path, step: int, rank: int) -> Manifest:
    path = step_dir(root, step) / f"{_stem(rank)}.json"
    try:
        manifest = Manifest.from_json(read_small(path, MANIFEST_LIMIT), str(path))
    except OSError as exc:
        raise CorruptCheckpointError(f"{path}: {exc.strerror or exc}") from None
    if (manifest.step, manifest.rank) != (step, rank):
        raise CorruptCheckpointError(f"{path}: manifest is for step {manifest.step} rank {manifest.rank}")
    if manifest.file != f"{_stem(rank)}.img":  # never a path elsewhere
        raise CorruptCheckpointError(f"{path}: manifest names the image {manifest.file!r}, not {_stem(rank)}.img")
    return manifest


def looks_loadable(root: Path, step: int, rank: int, world_size: int) -> bool:
    """A cheap check, no data read: a sound manifest this world size can use, and an image of its size."""
    try:
        manifest = read_manifest(root, step, rank)
    except CorruptCheckpointError:
        return False
    if manifest.world_size != world_size and not manifest.replicated:
        return False
    return regular_size(step_dir(root, step) / manifest.file) == manifest.size


def read_verified(root: Path, manifest: Manifest) -> torch.Tensor:
    """The image bytes as a uint8 tensor, after checking size and every block's CRC-32."""
    path = step_dir(root, manifest.step) / manifest.file
    try:
        with os.fdopen(open_regular(path), "rb", buffering=0) as source:
            size = os.fstat(source.fileno()).st_size
            if size != manifest.size:
                raise CorruptCheckpointError(f"{path}: {size} bytes, the manifest says {manifest.size} (truncated?)")
            data = landing_buffer(size, str(path))
            view = data.numpy().data
            checksums = Checksums()
            try:
                for start in range(0, size, manifest.block_size):
                    block = view[start : start + manifest.block_size]
                    if source.readinto(block) != len(block):
                        raise CorruptCheckpointError(f"{path}: short read at byte {start}")
                    checksums.add(block)
            finally:
                crcs = checksums.finish()
            for index, (got, expected) in enumerate(zip(crcs, manifest.crc32, strict=True)):
                if got != expected:
                    start = index * manifest.block_size
                    raise CorruptCheckpointError(
                        f"{path}: checksum mismatch in bytes {start}–{min(size, start + manifest.block_size)}"
                    )
    except OSError as exc:
        raise CorruptCheckpointError(f"{path}: {exc.strerror or exc}") from None
    return data


def _own_files(folder: Path, rank: int) -> Iterator[Path]:
    stem = _stem(rank)
    with contextlib.suppress(OSError):
        for name in os.listdir(folder):
            if name.startswith((stem + ".", f".{stem}.")):
                yield folder / name


def _remove_step(root: Path, step: int, rank: int) -> None:
    folder = step_dir(root, step)
    manifest = folder / f"{_stem(rank)}.json"
    with contextlib.suppress(FileNotFoundError):
        manifest.unlink()  # uncommit first: a half-deleted checkpoint must not look complete
    for path in _own_files(folder, rank):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    with contextlib.suppress(OSError):
        folder.rmdir()  # only succeeds once every rank's files are gone


def withdraw(root: Path, step: int, rank: int) -> None:
    """Uncommit this rank's checkpoint of ``step`` (its manifest goes; the image is a leftover from then on)."""
    folder = step_dir(root, step)
    with contextlib.suppress(FileNotFoundError):
        (folder / f"{_stem(rank)}.json").unlink()
        _fsync_dir(folder)


def prune(root: Path, rank: int, world_size: int, keep_last: int, keep_every: int | None,
          protect: Collection[int] = (), damaged: Collection[int] = ()) -> list[int]:
    """Delete this rank's loadable checkpoints outside the retention policy; returns the steps removed.

    Only checkpoints that :func:`looks_loadable` (and are not in ``damaged``, found so by a full read)
    count toward ``keep_last``, and only those are deleted: a damaged or foreign one is left alone.
    ``protect`` (the step just written, the newest verified one) is never deleted.
    """
    counted, removed = 0, []
    for step in sorted(committed_steps(root, rank), reverse=True):  # newest first
        if step in damaged:
            continue
        every = keep_every is not None and step % keep_every == 0
        if step in protect or (every and counted >= keep_last):
            counted += 1
            continue
        if not looks_loadable(root, step, rank, world_size):
            continue
        if counted < keep_last:
            counted += 1
        else:
            removed.append(step)
    for step in removed:
        _remove_step(root, step, rank)
    return removed


def clean_leftovers(root: Path, rank: int) -> None:
    """Remove this rank's temporary files and uncommitted images (a writer was killed mid-save)."""
    for _, folder in _step_folders(root):
        committed = (folder / f"{_stem(rank)}.json").exists()
        for path in _own_files(folder, rank):
            if path.name.endswith(".tmp") or (not committed and path.suffix == ".img"):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
        with contextlib.suppress(OSError):
            folder.rmdir()
