"""The operator's orders to one pod, as the files its annotations are mounted as (downward API).

The pod template mounts the pod's annotations with the downward API; the
kubelet rewrites the files (all at once) a moment after the operator patches
the pod.  :mod:`kcover.launcher.pod` reads them every tick:

- ``generation`` (``kcover.io/generation``): the generation the pod's workers
  must run; a higher one is a restart in place.  Empty: generation 0.
- ``rank`` (``kcover.io/rank``), only with ``kcover pod --assigned-rank``, for a
  job with warm standby pods (``kcover.io/standby``): its pods outnumber its
  ranks and the operator says which pod runs which rank.  The file holds a
  rank (0 … nnodes − 1: run it, for the rest of the pod's life: a rank is never
  taken back from a live pod, a pod that loses its node is deleted),
  ``standby`` or nothing (wait, warm), or ``done`` (the job finished without
  this pod: exit 0, so an Indexed Job can complete).

Reads never block (a FIFO or a device put where a file should be reads as
nothing) and never trust the text: anything else is None, and the caller
keeps what it had.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from kcover.podline import MAX_GENERATION

STANDBY = "standby"
DONE = "done"


def read_order(path: Path | None) -> str | None:
    """The stripped text of a small regular file; None when there is none or it cannot be read."""
    if path is None:
        return None
    try:  # never block on a FIFO or a device put where the file should be
        if not stat.S_ISREG(path.stat().st_mode):
            return None
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            return os.read(descriptor, 64).decode("ascii", "replace").strip()
        finally:
            os.close(descriptor)
    except OSError:
        return None


def read_generation(path: Path | None) -> int | None:
    """The generation the operator ordered (the annotation's text; empty = 0); None when unreadable or bad."""
    text = read_order(path)
    if text is None:
        return None
    if text == "":
        return 0
    if not text.isdigit() or int(text) > MAX_GENERATION:
        return None
    return int(text)


def read_rank(path: Path, nnodes: int) -> int | str | None:
    """The rank the operator assigned, :data:`STANDBY` (also for an empty or absent file: not yet assigned) or
    :data:`DONE`; None when the file says anything else (a rank out of range included)."""
    if not path.exists():
        return STANDBY
    text = read_order(path)
    if text is None:
        return None
    if text in ("", STANDBY):
        return STANDBY
    if text == DONE:
        return DONE
    if text.isdigit() and len(text) <= 7 and int(text) < nnodes:
        return int(text)
    return None
