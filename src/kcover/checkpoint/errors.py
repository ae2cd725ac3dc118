"""The checkpoint error vocabulary.

::

    CheckpointError               anything the user must hear about; the message names the file and cause
    ├── CheckpointWriteError      persisting failed (missing or unwritable dir, ENOSPC, EIO); nothing committed
    ├── CorruptCheckpointError    a file failed its checksum or is truncated; it is skipped on load
    ├── CheckpointInUseError      another live writer (process or Checkpointer) owns this dir and rank
    └── WorldSizeChangedError     sharded state saved by N ranks cannot be loaded by M ≠ N ranks

Write errors in the background never reach the training loop as exceptions:
:class:`~kcover.checkpoint.Checkpointer` logs them and keeps the newest one in
``last_error``, so training continues and the previous checkpoint stays intact.
"""

from __future__ import annotations


class CheckpointError(Exception):
    """A checkpoint could not be saved or loaded; the message says which and why."""


class CheckpointWriteError(CheckpointError):
    """Persisting a snapshot failed; nothing was committed and older checkpoints are untouched."""


class CorruptCheckpointError(CheckpointError):
    """A checkpoint's files are truncated, bit-flipped or inconsistent."""


class CheckpointInUseError(CheckpointError):
    """Another live Checkpointer — in this process or another — is already writing this dir and rank."""


class WorldSizeChangedError(CheckpointError):
    """Sharded state saved by one world size is being loaded by another."""
