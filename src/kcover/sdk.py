"""The optional worker-side SDK: tell the supervisor about progress and checkpoints.

Training scripts need none of this (kcover also reads step numbers from log
lines), but two calls make hang detection and ETTR exact::

    import kcover
    kcover.progress(step)        # after each optimizer step
    kcover.checkpointed(step)    # after a checkpoint of ``step`` is complete

Outside ``kcover run`` (no ``KCOVER_PROGRESS_FD``) both do nothing, so the same
script runs unchanged under ``torchrun`` or plain ``python``.
"""

from __future__ import annotations

import os

_FD_VARIABLE = "KCOVER_PROGRESS_FD"


def _send(text: str) -> None:
    fd = os.environ.get(_FD_VARIABLE)
    if not fd:
        return
    try:
        os.write(int(fd), text.encode())
    except (OSError, ValueError):
        os.environ.pop(_FD_VARIABLE, None)


def progress(step: int) -> None:
    """Report that training reached ``step`` (cheap: one small pipe write)."""
    _send(f"{int(step)}\n")


def checkpointed(step: int) -> None:
    """Report that a complete checkpoint of ``step`` is on disk."""
    _send(f"ckpt {int(step)}\n")
