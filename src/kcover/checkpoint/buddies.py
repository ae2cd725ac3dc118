"""Who keeps a copy of whose snapshot: buddy ranks on other nodes, and how ranks find each other.

A snapshot in ``/dev/shm`` dies with its node.  With ``Checkpointer(replicas=N)``
each rank's snapshot is also kept in the memory of ``N`` buddy ranks, each on a
different node than the rank and than each other.  :func:`buddies_of` chooses
them from the table every rank shares: nodes are ordered by the lowest rank they
host (so a spare that takes over a lost node's ranks takes over its place too),
and the ``i``-th rank of node ``k`` is kept by the ``i``-th rank (modulo its size)
of nodes ``k+1 … k+N``.  A job with fewer other nodes than ``N`` gets as many
buddies as there are other nodes.

:func:`this_node` names the node a rank runs on (``KCOVER_NODE``, set by
``kcover run`` and ``kcover pod``; else ``NODE_NAME``, ``GROUP_RANK``, the host
name); :func:`reachable_host` is the address peers reach this process at: the
local address of the route to ``MASTER_ADDR`` (the interface the process group
uses), unless ``KCOVER_REPLICA_HOST`` says otherwise; :func:`replica_port` its
port: any free one, or ``KCOVER_REPLICA_PORT`` + ``LOCAL_RANK`` where a network
policy must name it.  Called by
:mod:`~kcover.checkpoint.replication`.
"""

from __future__ import annotations

import os
import socket
from collections import defaultdict
from dataclasses import dataclass


@dataclass(frozen=True)
class Peer:
    """One rank as the others see it: where it runs and where its replica server listens."""

    rank: int
    node: str
    host: str
    port: int


def this_node() -> str:
    for name in ("KCOVER_NODE", "NODE_NAME"):
        if os.environ.get(name):
            return os.environ[name]
    if os.environ.get("GROUP_RANK", "").isdigit():
        return f"group-{os.environ['GROUP_RANK']}"
    return socket.gethostname()


def reachable_host() -> str:
    """The IP address peers reach this process at (see the module docstring)."""
    if os.environ.get("KCOVER_REPLICA_HOST"):
        return os.environ["KCOVER_REPLICA_HOST"]
    master = os.environ.get("MASTER_ADDR") or "127.0.0.1"
    try:
        family = socket.getaddrinfo(master, None)[0][0]
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect((master, 9))  # no packet is sent: this only asks the kernel for the route
            return str(probe.getsockname()[0])
    except OSError:
        return "127.0.0.1"


def replica_port() -> int:
    """The port to keep replicas on: ``KCOVER_REPLICA_PORT`` + ``LOCAL_RANK`` (so the ranks of one node differ),
    or 0 (any free port) when it is not set; raises ValueError naming the variable when it is no port."""
    base = os.environ.get("KCOVER_REPLICA_PORT", "").strip()
    if not base:
        return 0
    local = os.environ.get("LOCAL_RANK", "0").strip() or "0"
    ok = base.isascii() and base.isdigit() and local.isascii() and local.isdigit()
    if not (ok and int(base) >= 1 and int(base) + int(local) <= 65535):
        raise ValueError(f"KCOVER_REPLICA_PORT={base!r} with LOCAL_RANK={local!r} is no port (1-65535)")
    return int(base) + int(local)


def nodes_in_order(peers: list[Peer]) -> list[list[int]]:
    """The ranks of each node, nodes ordered by their lowest rank, ranks ascending."""
    by_node: dict[str, list[int]] = defaultdict(list)
    for peer in sorted(peers, key=lambda p: p.rank):
        by_node[peer.node].append(peer.rank)
    return sorted(by_node.values(), key=lambda ranks: ranks[0])


def buddies_of(peers: list[Peer], rank: int, replicas: int) -> list[int]:
    """The ranks that keep ``rank``'s replicas: ``replicas`` of them at most, each on its own other node."""
    nodes = nodes_in_order(peers)
    home = next(k for k, ranks in enumerate(nodes) if rank in ranks)
    index = nodes[home].index(rank)
    chosen = []
    for offset in range(1, min(replicas, len(nodes) - 1) + 1):
        ranks = nodes[(home + offset) % len(nodes)]
        chosen.append(ranks[index % len(ranks)])
    return chosen
