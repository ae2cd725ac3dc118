"""Finding the logs of a job on disk and what each one belongs to.

``kcover explain logs/`` accepts files and folders.  A folder is walked (hidden
entries skipped); every regular file in it is one source.  The rank and node of
a source are read from its path, by convention:

- a file or folder named ``rank3``, ``rank-3``, ``rank_3`` (``rank3.log``) → rank 3;
- the first folder below the given root (``logs/node-2/rank3.log``), or a file
  named like ``node-2.log`` / ``node-2-dmesg.log`` → node ``node-2``;
- CRI layout ``<namespace>_<pod>_<uid>/<container>/0.log`` → the pod name.

A path that cannot be read is named in a warning and skipped; it never stops
the others from being read.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from kcover.classify.collector import SourceInfo

_RANK = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)
_NODE_FILE = re.compile(r"^(node[-_]?[A-Za-z0-9]+)", re.IGNORECASE)
_CRI_POD = re.compile(r"^([^_]+)_([^_]+)_[0-9a-f\-]{8,}$")


@dataclass(frozen=True)
class FileSource:
    """One log file and what its path says about it."""

    info: SourceInfo
    path: Path


def _describe(path: Path, root: Path | None) -> SourceInfo:
    relative = path.relative_to(root) if root else Path(path.name)
    parts = relative.parts
    ranks = _RANK.findall(str(relative))
    rank = int(ranks[-1]) if ranks else None
    for part in parts[:-1]:
        pod = _CRI_POD.match(part)
        if pod:
            return SourceInfo(name=f"{pod.group(1)}/{pod.group(2)}", rank=rank)
    node: str | None = parts[0] if len(parts) > 1 else None
    if node is None:
        named = _NODE_FILE.match(path.stem)
        node = named.group(1) if named else None
    return SourceInfo(name=str(relative) if root else str(path), rank=rank, node=node)


def find_sources(paths: list[Path]) -> tuple[list[FileSource], list[str]]:
    """Expand files and folders into sources; unreadable paths become warnings."""
    sources: list[FileSource] = []
    warnings: list[str] = []
    for given in paths:
        if given.is_dir():
            found = _walk(given, warnings)
            sources.extend(FileSource(_describe(path, given), path) for path in found)
        elif given.exists():
            if os.access(given, os.R_OK):
                sources.append(FileSource(_describe(given, None), given))
            else:
                warnings.append(f"{given}: not readable, skipped")
        else:
            warnings.append(f"{given}: no such file or folder, skipped")
    return sources, warnings


def _walk(root: Path, warnings: list[str]) -> list[Path]:
    found: list[Path] = []

    def on_error(error: OSError) -> None:
        warnings.append(f"{error.filename}: not readable ({error.strerror}), skipped")

    for folder, folders, files in os.walk(root, onerror=on_error):
        folders[:] = sorted(name for name in folders if not name.startswith("."))
        for name in sorted(files):
            path = Path(folder) / name
            if name.startswith("."):
                continue
            if not path.is_file():
                warnings.append(f"{path}: not a regular file (broken link, pipe or socket), skipped")
                continue
            if not os.access(path, os.R_OK):
                warnings.append(f"{path}: not readable, skipped")
                continue
            found.append(path)
    return found
