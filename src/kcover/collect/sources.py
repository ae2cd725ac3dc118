"""Finding the logs of a job on disk and what each one belongs to.

``kcover explain logs/`` accepts files and folders.  A folder is walked (hidden
entries skipped); every regular file in it is one source.  The rank and node of
a source are read from its path, by convention:

- a file or folder named ``rank3``, ``rank-3``, ``rank_3`` (``rank3.log``) → rank 3;
- the first folder below the given root (``logs/node-2/rank3.log``), or a file
  named like ``node-2.log`` / ``node-2-dmesg.log`` → node ``node-2``;
- CRI layout ``<namespace>_<pod>_<uid>/<container>/0.log`` → the pod name.
- the files the kubelet rotated a log into (``0.log.20261201-101500[.gz]``)
  are read before it, as one source (:func:`_join_rotated`).

A path that cannot be read is named in a warning and skipped, with the real
reason (no such file, broken symlink, symlink loop, permission denied); it never
stops the others from being read.  Names taken from paths (the source, the node,
the pod) and the paths in warnings pass through :func:`printable`: a file name
is chosen by whoever wrote it and may hold terminal escapes or bytes that are
not UTF-8.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path, PurePath

from kcover.collect.printable import printable

_RANK = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)
_NODE_FILE = re.compile(r"^(node[-_]?[A-Za-z0-9]+)", re.IGNORECASE)
_CRI_POD = re.compile(r"^([^_]+)_([^_]+)_[0-9a-f\-]{8,}$")
ROTATED_SUFFIX = re.compile(r"\.(?P<stamp>\d{8}-\d{6})(?P<gz>\.gz)?$")
"""What the kubelet appends to a container log it rotates: ``.<YYYYMMDD-hhmmss>`` (Go's ``20060102-150405``),
then ``.gz`` once compressed at the next rotation."""


@dataclass(frozen=True)
class SourceInfo:
    """Where a stream of lines comes from: its name and, when known, rank and node."""

    name: str
    rank: int | None = None
    node: str | None = None


@dataclass(frozen=True)
class FileSource:
    """One log file and what its path says about it; ``rotated``: its older files, oldest first, read before it."""

    info: SourceInfo
    path: Path
    rotated: tuple[Path, ...] = ()

    @property
    def paths(self) -> tuple[Path, ...]:
        """The files of this log in the order they were written: one stream, as ``kubectl logs`` reads them."""
        return (*self.rotated, self.path)


def _describe(path: Path, root: Path | None) -> SourceInfo:
    relative = path.relative_to(root) if root else Path(path.name)
    return describe_relative(relative, str(relative) if root else str(path))


def is_pod_folder(name: str) -> bool:
    """Whether a folder is named as the kubelet names a pod's log folder (``<namespace>_<pod>_<uid>``)."""
    return _CRI_POD.match(name) is not None


def describe_relative(relative: PurePath, name: str) -> SourceInfo:
    """What a log's path below the given root says: rank, node or pod (``name`` when nothing better).

    Also used for the logs inside an archive, whose paths are read as if the
    archive were the folder given.
    """
    parts = relative.parts
    ranks = _RANK.findall(str(relative))
    rank = int(ranks[-1]) if ranks else None
    for at, part in enumerate(parts[:-1]):
        pod = _CRI_POD.match(part)
        if pod:  # namespace/pod/container/0.log: each container and restart of a pod is its own source
            return SourceInfo(name=printable("/".join((pod.group(1), pod.group(2), *parts[at + 1:]))), rank=rank)
    node: str | None = parts[0] if len(parts) > 1 else None
    if node is None:
        named = _NODE_FILE.match(relative.stem)
        node = named.group(1) if named else None
    return SourceInfo(name=printable(name), rank=rank, node=None if node is None else printable(node))


def _skipped(path: Path, reason: str) -> str:
    return f"{printable(str(path))}: {reason}, skipped"


def _why(path: Path, error: OSError) -> str:
    """What is wrong with a path that cannot be opened, in the user's words."""
    if error.errno == errno.ELOOP:
        return "symlink loop (ELOOP)"
    if error.errno == errno.ENOENT:
        return "broken symlink" if path.is_symlink() else "no such file or folder"
    return f"cannot read ({error.strerror or error})"


def _status(path: Path) -> os.stat_result | str:
    """The path's status (following links), or why it has none."""
    try:
        return path.stat()
    except OSError as error:
        return _why(path, error)


def find_sources(paths: list[Path]) -> tuple[list[FileSource], list[str]]:
    """Expand files and folders into sources; unreadable paths become warnings."""
    sources: list[FileSource] = []
    warnings: list[str] = []
    for given in paths:
        status = _status(given)
        if isinstance(status, str):
            warnings.append(_skipped(given, status))
        elif stat.S_ISDIR(status.st_mode):
            found = _walk(given, warnings)
            sources.extend(FileSource(_describe(path, given), path) for path in found)
        elif os.access(given, os.R_OK):
            sources.append(FileSource(_describe(given, None), given))
        else:
            warnings.append(_skipped(given, "not readable"))
    return _join_rotated(_one_name_each(sources)), warnings


def _join_rotated(sources: list[FileSource]) -> list[FileSource]:
    """A log and the files the kubelet rotated it into (``0.log.20261201-101500[.gz]``) become one source.

    The rotated files hold the log's earlier lines; read apart, the end of each
    would pass for an end of the log.  They are read before the log, oldest
    first (their timestamps sort so), and line numbers run on across them, as
    ``kubectl logs`` shows them.  Rotated files whose log is not among the
    sources are read on their own.
    """
    logs = {source.path for source in sources}
    rotated: dict[Path, dict[str, Path]] = {}
    joined = set()
    for source in sources:
        match = ROTATED_SUFFIX.search(source.path.name)
        log = source.path.with_name(source.path.name[: match.start()]) if match else None
        if match and log is not None and log.suffix == ".log" and log in logs:
            joined.add(source.path)
            stamps = rotated.setdefault(log, {})
            if match["gz"] is None or match["stamp"] not in stamps:  # mid-compression, both there: the plain one
                stamps[match["stamp"]] = source.path
    return [
        replace(source, rotated=tuple(path for _, path in sorted(rotated.get(source.path, {}).items())))
        for source in sources
        if source.path not in joined
    ]


def _one_name_each(sources: list[FileSource]) -> list[FileSource]:
    """Each file once, under a name no other file has.

    Two files may describe alike: two runs' ``rank0.log``, a pod deleted and
    recreated under its name (``ns/pod/container/0.log``).  Their faults,
    kept ends and excuses must not mix, so such files are named by their path.
    """
    seen: set[str] = set()
    unique = []
    for source in sources:
        real = os.path.realpath(source.path)
        if real not in seen:
            seen.add(real)
            unique.append(source)
    names = Counter(source.info.name for source in unique)
    return [
        replace(source, info=replace(source.info, name=printable(str(source.path))))
        if names[source.info.name] > 1 else source
        for source in unique
    ]


def _walk(root: Path, warnings: list[str]) -> list[Path]:
    found: list[Path] = []

    def on_error(error: OSError) -> None:
        warnings.append(_skipped(Path(error.filename), f"not readable ({error.strerror})"))

    for folder, folders, files in os.walk(root, onerror=on_error):
        folders[:] = sorted(name for name in folders if not name.startswith("."))
        for name in sorted(files):
            path = Path(folder) / name
            if name.startswith("."):
                continue
            problem = _problem(path)
            if problem:
                warnings.append(_skipped(path, problem))
                continue
            found.append(path)
    return found


def _problem(path: Path) -> str | None:
    """Why a file found in a folder cannot be read as a log, or None when it can."""
    status = _status(path)
    if status == "broken symlink":
        return "not a regular file (broken symlink)"
    if isinstance(status, str):
        return status
    if not stat.S_ISREG(status.st_mode):
        return "not a regular file (pipe, socket or device)"
    return None if os.access(path, os.R_OK) else "not readable"
