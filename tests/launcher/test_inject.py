"""Fault injection: which injections are due on a tick, and that each fires once (hardware ones once per attempt)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from kcover.launcher.inject import InjectKind, Injector, parse_injections


def worker(rank: int, node: str, exit_code: int | None = None) -> Any:
    """A stand-in for a running :class:`~kcover.launcher.workers.Worker` (the injector reads only these)."""
    return SimpleNamespace(rank=rank, node=node, pid=1_000_000 + rank, exit_code=exit_code)


WORKERS = [worker(0, "node-0"), worker(1, "node-0"), worker(2, "node-1"), worker(3, "node-1")]


def test_a_step_injection_waits_for_its_rank_to_reach_the_step() -> None:
    injector = Injector(parse_injections("crash@rank3:step=10"))
    assert injector.due(1, WORKERS, {3: 9}, elapsed=100.0) == []
    [shot] = injector.due(1, WORKERS, {3: 10}, elapsed=100.0)
    assert shot.worker.rank == 3 and shot.kills and shot.kernel_line is None
    assert injector.due(1, WORKERS, {3: 11}, elapsed=100.0) == []  # fired once
    assert injector.due(2, WORKERS, {3: 11}, elapsed=100.0) == []  # and not again in the next attempt


def test_a_node_target_hits_its_first_rank_and_hardware_faults_follow_the_node() -> None:
    injector = Injector(parse_injections("xid79@node-1:after=2"))
    assert injector.due(1, WORKERS, {}, elapsed=1.0) == []
    [shot] = injector.due(1, WORKERS, {}, elapsed=2.0)
    assert shot.worker.rank == 2
    assert shot.kernel_line is not None and "Xid" in shot.kernel_line and f"pid={shot.worker.pid}" in shot.kernel_line
    assert injector.due(1, WORKERS, {}, elapsed=3.0) == []
    assert [s.worker.rank for s in injector.due(2, WORKERS, {}, elapsed=3.0)] == [2]  # a broken GPU stays broken


@pytest.mark.parametrize(("kind", "kills"),
                         [(InjectKind.HANG, False), (InjectKind.OOM, True), (InjectKind.CRASH, True)])
def test_only_a_hang_leaves_the_worker_alive(kind: InjectKind, kills: bool) -> None:
    [shot] = Injector(parse_injections(f"{kind.value}@rank0")).due(1, WORKERS, {}, elapsed=0.0)
    assert shot.kills is kills


def test_an_exited_or_missing_target_is_skipped() -> None:
    injector = Injector(parse_injections("crash@rank0,crash@rank7"))
    assert injector.due(1, [worker(0, "node-0", exit_code=1)], {}, elapsed=5.0) == []
    assert [s.worker.rank for s in injector.due(1, WORKERS, {}, elapsed=5.0)] == [0]
