"""Pairwise slow-node detection: pair the job's nodes, time matmul + all-reduce per pair, blame the common member.

A collective runs at the speed of its slowest member, so one slow node slows
the whole job without failing anything.  Two rounds find it (the scheme of
DLRover's node check): round 1 pairs neighbours (0,1), (2,3), …; a pair
slower than ``factor`` × the (low) median pair time is slow.  Round 2 pairs each
member of a slow pair (and an odd node out) with a member of a fast pair; a
node slow in every pairing it took part in is the slow node.  When every pair
is slow, the median is slow too and nobody is blamed (a slow fabric is not a
bad node).

:func:`plan_first_round`, :func:`plan_second_round` and :func:`find_slow_nodes`
are pure.  :func:`pairwise_worker` is what each node runs (one process per
node, gloo over TCP: rank 0 plans and decides, everyone reads the verdict from
the store); :func:`simulate_pairwise` runs N such "nodes" as local processes on
loopback, with ``slowdown`` making chosen nodes take that many times as long for
each matmul (as a throttled GPU would) — the knob the tests use.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

Pair = tuple[int, int]


@dataclass(frozen=True)
class PairwiseSpec:
    """How much work one pairing does (small on CPU; bigger on GPUs) and what counts as slow."""

    matmul_size: int = 768  # compute must dominate an iteration, or a slow device hides behind the network
    iterations: int = 10
    allreduce_bytes: int = 256 << 10
    factor: float = 2.0
    timeout_s: float = 120.0


@dataclass(frozen=True)
class PairwiseResult:
    nodes: tuple[str, ...]
    pair_seconds: dict[str, float]  # "a+b" -> seconds
    baseline_seconds: float
    slow_nodes: tuple[str, ...]
    rounds: tuple[tuple[Pair, ...], ...] = field(default=())

    def to_dict(self) -> dict[str, object]:
        return {
            "nodes": list(self.nodes),
            "pair_seconds": self.pair_seconds,
            "baseline_seconds": self.baseline_seconds,
            "slow_nodes": list(self.slow_nodes),
        }


def plan_first_round(count: int) -> list[Pair]:
    """Neighbour pairs; an odd node out waits for round 2."""
    return [(i, i + 1) for i in range(0, count - 1, 2)]


def plan_second_round(count: int, first: dict[Pair, float], factor: float) -> list[Pair]:
    """Pair each member of a slow pair (and the odd node out) with a distinct member of a fast pair."""
    baseline = statistics.median_low(first.values()) if first else 0.0
    slow = [pair for pair, seconds in first.items() if seconds > factor * baseline]
    fast_members = [n for pair, seconds in first.items() if seconds <= factor * baseline for n in pair]
    paired = {n for pair in first for n in pair}
    suspects = [n for pair in slow for n in pair] + [n for n in range(count) if n not in paired]
    return [(suspect, partner) for suspect, partner in zip(suspects, fast_members, strict=False)]


def find_slow_nodes(seconds: dict[Pair, float], baseline: float, factor: float) -> list[int]:
    """Nodes slow in every pairing they took part in, given at least two pairings (or one with a cleared partner)."""
    slow_pairs = {pair for pair, value in seconds.items() if value > factor * baseline}
    cleared = {n for pair in seconds if pair not in slow_pairs for n in pair}
    blamed = []
    for node in sorted({n for pair in seconds for n in pair}):
        mine = [pair for pair in seconds if node in pair]
        if not all(pair in slow_pairs for pair in mine):
            continue
        partners_cleared = all((pair[0] if pair[1] == node else pair[1]) in cleared for pair in mine)
        if len(mine) >= 2 or partners_cleared:
            blamed.append(node)
    return blamed


def _work(torch: Any, group: Any, spec: PairwiseSpec, slowdown: float) -> float:
    from kcover.health.checks.collective import timed_allreduce

    a = torch.randn(spec.matmul_size, spec.matmul_size)
    product = a @ a
    message = torch.ones(max(1, spec.allreduce_bytes // 4))
    timed_allreduce(torch, spec.allreduce_bytes, 1, group=group)  # warm-up of this pair's group
    started = time.perf_counter()
    for _ in range(spec.iterations):
        begun = time.perf_counter()
        torch.mm(a, a, out=product)
        if slowdown > 1:  # a throttled device: the same work takes longer, without using more host CPU
            time.sleep((slowdown - 1) * (time.perf_counter() - begun))
        torch.distributed.all_reduce(message, group=group)
    return time.perf_counter() - started


def _run_round(
    torch: Any, store: Any, rank: int, label: str, pairs: list[Pair], spec: PairwiseSpec, slowdown: float
) -> None:
    dist = torch.distributed
    groups = [dist.new_group(list(pair), backend="gloo") for pair in pairs]  # every rank, same order
    for pair, group in zip(pairs, groups, strict=True):
        if rank in pair:
            store.set(f"{label}/{pair[0]}+{pair[1]}/{rank}", str(_work(torch, group, spec, slowdown)))
    dist.barrier()


def _pair_time(store: Any, label: str, pair: Pair) -> float:
    return max(float(store.get(f"{label}/{pair[0]}+{pair[1]}/{member}")) for member in pair)


def pairwise_worker(
    rank: int, names: Sequence[str], store: Any, spec: PairwiseSpec, slowdown: float = 1.0
) -> PairwiseResult:
    """Run on every node (rank = index in ``names``) with a shared store; every rank returns the verdict."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", store=store, rank=rank, world_size=len(names), timeout=timedelta(seconds=spec.timeout_s)
    )
    try:
        first = plan_first_round(len(names))
        _run_round(torch, store, rank, "r1", first, spec, slowdown)
        if rank == 0:
            times = {pair: _pair_time(store, "r1", pair) for pair in first}
            store.set("plan2", json.dumps(plan_second_round(len(names), times, spec.factor)))
        second = [(a, b) for a, b in json.loads(store.get("plan2"))]
        _run_round(torch, store, rank, "r2", second, spec, slowdown)
        if rank == 0:
            store.set("result", json.dumps(_decide(names, store, first, second, spec)))
        result = json.loads(store.get("result"))
    finally:
        dist.destroy_process_group()
    return PairwiseResult(
        tuple(names),
        result["pair_seconds"],
        result["baseline_seconds"],
        tuple(result["slow_nodes"]),
        (tuple(first), tuple(second)),
    )


def _decide(
    names: Sequence[str], store: Any, first: list[Pair], second: list[Pair], spec: PairwiseSpec
) -> dict[str, Any]:
    times = {pair: _pair_time(store, "r1", pair) for pair in first}
    baseline = statistics.median_low(times.values()) if times else 0.0
    times |= {pair: _pair_time(store, "r2", pair) for pair in second}
    slow = find_slow_nodes(times, baseline, spec.factor)
    return {
        "pair_seconds": {f"{names[a]}+{names[b]}": round(value, 4) for (a, b), value in times.items()},
        "baseline_seconds": round(baseline, 4),
        "slow_nodes": [names[n] for n in slow],
    }


def _simulated_node(rank: int, names: list[str], port_pipe: Any, spec: PairwiseSpec, slowdown: float) -> None:
    import torch.distributed as dist

    port = int(port_pipe.recv())  # forked before the store's server thread exists: a fork never copies its locks
    store = dist.TCPStore(  # type: ignore[attr-defined]
        "127.0.0.1", port, len(names) + 1, is_master=False, timeout=timedelta(seconds=spec.timeout_s)
    )
    pairwise_worker(rank, names, store, spec, slowdown)


def simulate_pairwise(
    count: int, spec: PairwiseSpec | None = None, slowdown: dict[str, float] | None = None
) -> PairwiseResult:
    """Run the pairwise test with ``count`` local processes as nodes ``node-0`` …, gloo on loopback."""
    import torch.distributed as dist

    spec = spec or PairwiseSpec()
    names = [f"node-{i}" for i in range(count)]
    context: Any = multiprocessing.get_context("fork")  # torch is imported once, in this process
    pipes, processes = [], []
    for rank, name in enumerate(names):
        receive, send = context.Pipe(duplex=False)
        process = context.Process(
            target=_simulated_node, args=(rank, names, receive, spec, (slowdown or {}).get(name, 1.0))
        )
        process.start()
        receive.close()
        pipes.append(send)
        processes.append(process)
    try:
        store = dist.TCPStore(  # type: ignore[attr-defined]
            "127.0.0.1",
            0,
            count + 1,
            is_master=True,
            timeout=timedelta(seconds=spec.timeout_s),
            wait_for_workers=False,
        )
        for send in pipes:
            send.send(store.port)
        deadline = time.monotonic() + spec.timeout_s
        for process in processes:
            process.join(max(0.0, deadline - time.monotonic()))
        failed = [p.exitcode for p in processes if p.exitcode != 0]
        if failed:
            raise RuntimeError(f"pairwise test: a node process ended with {failed[0]} (None = timed out)")
        result = json.loads(store.get("result"))
    finally:
        for process in processes:
            if process.is_alive():
                process.kill()
            process.join()
    first = plan_first_round(count)
    return PairwiseResult(
        tuple(names), result["pair_seconds"], result["baseline_seconds"], tuple(result["slow_nodes"]), (tuple(first),)
    )


def env_store(spec: PairwiseSpec) -> tuple[int, int, Any]:
    """Rank, world size and a TCPStore from torchrun's variables: NODE_RANK and NNODES (or, one pod per
    node as a PyTorchJob runs them, RANK and WORLD_SIZE), MASTER_ADDR, MASTER_PORT."""
    import torch.distributed as dist

    try:
        rank = int(os.environ.get("NODE_RANK") or os.environ["RANK"])
        world = int(os.environ.get("NNODES") or os.environ["WORLD_SIZE"])
        address = os.environ["MASTER_ADDR"]
    except KeyError as missing:
        raise PairwiseSetupError(f"the pairwise test needs the environment variable {missing.args[0]} "
                                 "(NODE_RANK or RANK, NNODES or WORLD_SIZE, MASTER_ADDR, MASTER_PORT)") from None
    except ValueError as bad:
        raise PairwiseSetupError(f"the pairwise test's rank and world size must be integers: {bad}") from None
    store = dist.TCPStore(  # type: ignore[attr-defined]
        address,
        int(os.environ.get("MASTER_PORT", "29500")),
        world,
        is_master=rank == 0,
        timeout=timedelta(seconds=spec.timeout_s),
    )
    return rank, world, store


class PairwiseSetupError(ValueError):
    """The environment does not say how to reach the other nodes."""


def pairwise_across_nodes(node: str, spec: PairwiseSpec) -> PairwiseResult:
    """Run the pairwise test as this node's part (one ``kcover preflight --pairwise`` per node).

    The nodes meet through torchrun's variables (:func:`env_store`) and tell each other their names.
    ``KCOVER_PAIRWISE_SLOWDOWN`` (a factor, for tests) makes this node's matmuls that much slower,
    as a throttled GPU would be.
    """
    rank, world, store = env_store(spec)
    store.set(f"name/{rank}", node)
    names = [bytes(store.get(f"name/{other}")).decode() for other in range(world)]
    if len(set(names)) != len(names):
        raise PairwiseSetupError(f"the pairwise test needs one process per node; node names repeat: {names}")
    slowdown = float(os.environ.get("KCOVER_PAIRWISE_SLOWDOWN", "1"))
    return pairwise_worker(rank, names, store, spec, slowdown)
