"""Fast, never-torn checkpoints for distributed training (``pip install kcover[torch]``).

Recovery time is detection + restart + checkpoint save/load; this package makes
the last term small.  :class:`Checkpointer` snapshots a (nested) state dict into
shared memory — the only part that blocks training — persists it in the
background with fsync, per-block CRC-32 and an atomic manifest rename, restores
a restarted worker from shared memory at memory speed, and persists the newest
snapshot when the supervisor sends SIGTERM; with ``replicas=N`` a rank whose
node was lost restores from a buddy's memory.  See the README section
"Checkpoints" for the guarantees and their limits.

Layout: :mod:`.checkpointer` (the API), :mod:`.locations` (snapshot names, the
dir's id), :mod:`.snapshot` (the shared-memory buffer), :mod:`.image` (the byte
layout), :mod:`.disk` and :mod:`.manifest` (files), :mod:`.restore` (reading a
candidate back), :mod:`.flatten` (state ↔ tensors + skeleton), :mod:`.shards`
(DTensor local shards), :mod:`.emergency` (SIGTERM), :mod:`.agree` (ranks agree
on a step), :mod:`.errors`; replicas in a peer's memory: :mod:`.replication`
(one rank's part), :mod:`.buddies` (who keeps whose), :mod:`.replica_link` (the
side channel), :mod:`.replica_store` (the kept files); :mod:`.checksums` and
:mod:`.landing` (CRC-32 and read buffers for disk and peer alike).
"""

from kcover.checkpoint.checkpointer import Checkpointer
from kcover.checkpoint.errors import (
    CheckpointError,
    CheckpointInUseError,
    CheckpointWriteError,
    CorruptCheckpointError,
    WorldSizeChangedError,
)
from kcover.checkpoint.locations import remove_snapshots, snapshot_path
from kcover.checkpoint.restore import Restored
from kcover.checkpoint.shards import copy_into, local_shards

__all__ = [
    "CheckpointError",
    "CheckpointInUseError",
    "CheckpointWriteError",
    "Checkpointer",
    "CorruptCheckpointError",
    "Restored",
    "WorldSizeChangedError",
    "copy_into",
    "local_shards",
    "remove_snapshots",
    "snapshot_path",
]
