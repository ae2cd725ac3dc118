"""Command-line argument types shared by the benchmarks.

A benchmark given a folder that does not exist should say so in one line, as argparse does for
any other bad argument, instead of failing later with a traceback from ``tempfile``.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def existing_dir(text: str) -> Path:
    """An argparse ``type=``: the path, if it names an existing directory."""
    path = Path(text)
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: not an existing directory")
    return path
