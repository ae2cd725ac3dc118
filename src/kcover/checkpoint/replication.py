"""One rank's part in peer replication: its keeper server, its buddies, pushes and fetches.

Created by a :class:`~kcover.checkpoint.Checkpointer` with ``replicas > 0``,
after ``torch.distributed`` is initialized.  Creation is collective: every rank
shares, with one ``all_gather_object``, where its
:class:`~kcover.checkpoint.replica_link.ReplicaServer` listens, the node it
runs on and a secret (rank 0's is used) — or that it cannot keep replicas (no
shared-memory folder); then replication is on for every rank or for none, so
the ranks' later collectives stay paired.  :meth:`Replication.inventory` is
collective too, called by ``load_latest`` so that each rank learns which
keepers hold which of its steps.  :meth:`Replication.push_all` runs on the
Checkpointer's background thread after each snapshot, at the lowest CPU priority
(:func:`~kcover.checkpoint.replica_link.yield_to_training`): one buddy after
another, paced, abandoned within half a second when the process is being
stopped, and a buddy that takes nothing for ten seconds is given up with a warning.
"""

from __future__ import annotations

import ipaddress
import logging
import secrets
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

from kcover.checkpoint import replica_link
from kcover.checkpoint.buddies import Peer, buddies_of, reachable_host, replica_port, this_node
from kcover.checkpoint.errors import CheckpointError
from kcover.checkpoint.replica_store import ReplicaStore

log = logging.getLogger("kcover.checkpoint")
MIN_BANDWIDTH = 1e6  # bytes/s: below this a value was probably meant in MB/s


def _all_gather(value: Any) -> list[Any]:
    import torch.distributed as dist

    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, value)
    return gathered


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


class Replication:
    """Replicas of this rank's snapshots on its buddies, and its buddies' replicas here."""

    def __init__(self, store: ReplicaStore, server: replica_link.ReplicaServer, table: list[Peer], rank: int,
                 replicas: int, bandwidth: float | None) -> None:
        self.store, self.server, self.rank, self.bandwidth = store, server, rank, bandwidth
        self.peers = {peer.rank: peer for peer in table}
        self.buddies = buddies_of(table, rank, replicas)
        self.keeps = {other for other in self.peers if rank in buddies_of(table, other, replicas)}
        here = self.peers[rank].node
        store.serves = frozenset(peer.rank for peer in table if peer.node != here)
        if len(self.buddies) < replicas:
            log.warning("kcover checkpoint: replicas=%d, but the job has %d other node(s): rank %d's snapshot is "
                        "kept by %d buddy rank(s)", replicas, len(self.buddies), rank, len(self.buddies))
        local = sorted(p.rank for p in table if _loopback(p.host))
        if local and len(local) < len(table) and rank == min(local):
            log.warning("kcover checkpoint: rank(s) %s can be reached only at a loopback address (MASTER_ADDR "
                        "resolves to this host?): set KCOVER_REPLICA_HOST to an address the other nodes reach",
                        ", ".join(map(str, local)))
        self.replicated_step: int | None = None
        self.last_error: CheckpointError | OSError | None = None
        self.last_push_seconds = 0.0

    def push_all(self, step: int, data: memoryview, stop: threading.Event) -> None:
        """Send this rank's snapshot of ``step`` to every buddy (on a background thread)."""
        replica_link.yield_to_training()  # this thread ends with the pushes
        began = time.perf_counter()
        done = 0
        for buddy in self.buddies:
            peer = self.peers[buddy]
            try:
                if not replica_link.push(peer.host, peer.port, self.server.secret, self.rank, step, data,
                                         bandwidth=self.bandwidth, stop=stop):
                    return
                done += 1
            except (OSError, CheckpointError) as exc:
                self.last_error = exc
                log.warning("kcover checkpoint: step %d: replica to rank %d (%s:%d) failed: %s; its previous "
                            "replica stays", step, buddy, peer.host, peer.port, exc)
        self.last_push_seconds = time.perf_counter() - began
        if done == len(self.buddies):
            self.replicated_step = step

    def inventory(self) -> dict[int, list[int]]:
        """Collective: this rank's steps that keepers hold → those keepers' ranks (own node's last)."""
        held = [(h.rank, h.step) for h in self.store.offered()]
        holders: dict[int, list[int]] = defaultdict(list)
        for keeper, replicas in enumerate(_all_gather(held)):
            for rank, step in replicas:
                if rank == self.rank:
                    holders[step].append(keeper)
        mine = self.peers[self.rank].node
        return {step: sorted(keepers, key=lambda k: (self.peers[k].node == mine, k))
                for step, keepers in holders.items()}

    def fetch(self, keeper: int, step: int) -> torch.Tensor | None:
        """This rank's replica of ``step`` from ``keeper``, checksum verified; None when it is gone."""
        peer = self.peers[keeper]
        return replica_link.fetch(peer.host, peer.port, self.server.secret, self.rank, step)

    def where(self, keeper: int) -> str:
        peer = self.peers[keeper]
        return f"rank {keeper} on {peer.node} ({peer.host}:{peer.port})"

    def close(self, remove: bool = False) -> None:
        """Stop serving (pushes in progress are cut and leave nothing); ``remove``: also delete the replicas
        this rank keeps (the job is finished)."""
        self.server.close()
        if remove:
            for held in self.store.held():
                if held.rank in self.keeps:
                    held.path.unlink(missing_ok=True)


def check_replica_options(replicas: int, bandwidth: float | None) -> None:
    """Refuse values that cannot be honoured (``replicas`` a whole number ≥ 0, ``bandwidth`` ≥ 1 MB/s)."""
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
        raise ValueError(f"replicas must be a whole number ≥ 0, not {replicas!r}")
    if bandwidth is not None and not (isinstance(bandwidth, int | float) and MIN_BANDWIDTH <= bandwidth < float("inf")):
        raise ValueError(f"replica_bandwidth must be a number of bytes per second ≥ {MIN_BANDWIDTH:.0e} (1 MB/s), "
                         f"or None; not {bandwidth!r}")


def start_replication(snapshot: Path | None, replicas: int, bandwidth: float | None, rank: int,
                      world_size: int) -> Replication | None:
    """Replication for the rank whose snapshot file is ``snapshot`` (collective); None when it is off."""
    if replicas == 0:
        return None
    if world_size == 1:
        log.warning("kcover checkpoint: replicas=%d, but the job has one rank: replication is off", replicas)
        return None
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise CheckpointError(f"replicas={replicas} needs torch.distributed: create the Checkpointer after "
                              "init_process_group (creating it is then collective: every rank must)")
    store, server, why = _listen(snapshot)
    try:
        me: Peer | str = Peer(rank, this_node(), reachable_host(), server.port) if server is not None else why
        table = _all_gather((me, secrets.token_bytes(replica_link.SECRET_SIZE)))
    except BaseException:
        if server is not None:
            server.close()
        raise
    unable = {r: peer for r, (peer, _) in enumerate(table) if not isinstance(peer, Peer)}
    if unable or server is None or store is None:
        if server is not None:
            server.close()
        if rank == min(unable):
            log.warning("kcover checkpoint: replicas=%d is off for every rank: %s", replicas,
                        "; ".join(f"rank {r} {reason}" for r, reason in unable.items()))
        return None
    server.secret = table[0][1]
    return Replication(store, server, [peer for peer, _ in table], rank, replicas, bandwidth)


def _listen(snapshot: Path | None) -> tuple[ReplicaStore | None, replica_link.ReplicaServer | None, str]:
    """This rank's store and server, or why it cannot keep replicas (said to every rank, never raised: the
    others are about to wait for this one in a collective)."""
    if snapshot is None:
        return None, None, "has no shared-memory folder to keep replicas in"
    host = reachable_host()
    try:
        port = replica_port()
    except ValueError as exc:
        return None, None, f"cannot listen: {exc}"
    store = ReplicaStore(snapshot.parent, snapshot.name[: -len("00000.img")])
    try:
        return store, replica_link.ReplicaServer(store, host, port), ""
    except OSError as exc:
        return None, None, f"cannot listen on {host} port {port or 'any'}: {exc.strerror or exc}"
