"""Snapshots replicated to a buddy on another node: a lost node's ranks restore from a peer's memory.

Real gloo process groups of four ranks on two simulated nodes, each node with its own shared-memory
folder; a lost node is one whose folder is emptied before the job restarts.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.checkpoint.conftest import WORKERS
from tests.checkpoint.states import make_state

from kcover.checkpoint import Checkpointer, CheckpointError
from kcover.checkpoint.buddies import replica_port

WORLD, PER_NODE = 4, 2


class Job:
    """Four rank processes of one phase of ``workers/replicas.py``."""

    def __init__(self, root: Path, phase: str, *extra: str, steps: int = 2, persist: str = "",
                 **more: str) -> None:
        store = root / f"store-{time.monotonic_ns()}"
        env = dict(os.environ, STEPS=str(steps), PERSIST=persist, **more)
        self.ranks = [subprocess.Popen(
            [sys.executable, str(WORKERS / "replicas.py"), phase, str(root / "ckpt"), str(rank), str(WORLD),
             str(PER_NODE), str(store), str(root / "shm"), *extra],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for rank in range(WORLD)]

    def outputs(self) -> list[str]:
        results = [rank.communicate(timeout=120) for rank in self.ranks]
        for rank, (_, stderr) in zip(self.ranks, results, strict=True):
            assert rank.returncode == 0, stderr
        self.stderr = "".join(stderr for _, stderr in results)
        return [stdout.strip().splitlines()[-1] for stdout, _ in results]

    def kill(self) -> None:
        for rank in self.ranks:
            rank.kill()
            rank.communicate(timeout=30)


@pytest.fixture
def root(shm_dir: Path) -> Iterator[Path]:
    yield shm_dir  # checkpoint dir and both nodes' shared memory in one folder that is removed afterwards


def lose_node(root: Path, node: int) -> None:
    for path in (root / "shm" / f"node-{node}").iterdir():
        path.unlink()


def test_a_lost_nodes_ranks_restore_from_their_buddies_memory(root: Path) -> None:
    assert Job(root, "save", steps=3).outputs() == ["replicated 3"] * WORLD
    assert not list((root / "ckpt").glob("step-*"))  # memory only: nothing on disk to fall back to
    held = sorted(p.name.split("-rank")[1][:17] for p in (root / "shm" / "node-0").glob("*.replica-*"))
    assert held == ["00002.replica-s2-", "00002.replica-s3-", "00003.replica-s2-", "00003.replica-s3-"], held
    lose_node(root, 1)
    assert Job(root, "restore").outputs() == ["restored 3 memory"] * 2 + ["restored 3 peer"] * 2


def test_ranks_laid_out_again_on_other_nodes_restore_what_they_left_in_memory_from_the_ranks_there(
        root: Path) -> None:
    """Node-1 is lost and the new layout puts ranks 0, 1 on the new node-1 and ranks 2, 3 on node-0 (a pod
    goes wherever the scheduler puts it).  Node-0 holds ranks 0 and 1's own snapshots, left behind, and the
    replicas of ranks 2 and 3: ranks 2, 3 now run there and serve all of it, so every rank restores step 3
    from memory; nothing is on disk."""
    assert Job(root, "save", steps=3).outputs() == ["replicated 3"] * WORLD
    lose_node(root, 1)
    assert Job(root, "restore", MOVED="1").outputs() == ["restored 3 peer"] * WORLD
    assert not list((root / "ckpt").glob("step-*"))


def test_a_keeper_killed_mid_replica_leaves_the_older_replica_never_a_torn_one(root: Path) -> None:
    """Rank 0's step 3 is on its way to rank 2 (paced) when rank 2 is SIGKILLed; then node-0 is lost too.

    Step 2 is on disk.  Rank 0's step 3 never arrived whole, so its newest is the older replica, step 2; node-1's
    ranks have step 3 in memory, but their replicas died with node-0: they restore step 2 from their own memory
    (the snapshot before the newest is kept there too).
    """
    job = Job(root, "slow", "1024", "2000000", steps=3, persist="2")  # an 8.4 MB snapshot at 2 MB/s: ~4 s in transfer
    for rank in job.ranks:
        assert rank.stdout is not None
        while (line := rank.stdout.readline()) and line.strip() != "saved 3":
            pass
    node1 = root / "shm" / "node-1"
    deadline = time.monotonic() + 30
    while not list(node1.glob("*rank00000.replica-p*.img.next")):
        assert time.monotonic() < deadline, sorted(p.name for p in node1.iterdir())
        time.sleep(0.02)
    os.kill(job.ranks[2].pid, signal.SIGKILL)
    job.kill()
    replicas = sorted(p.name.split(".replica-")[1][:2] for p in node1.glob("*rank00000.replica-*"))
    # the torn one never got a committed name; it was written into step 1's file (a commit would have dropped
    # step 1), so the newest whole replica, step 2, stays
    assert replicas[1:] == ["s2"] and replicas[0].startswith("p")
    lose_node(root, 0)
    assert Job(root, "restore", "1024").outputs() == ["restored 2 peer"] * 2 + ["restored 2 memory"] * 2


def test_one_rank_without_shared_memory_turns_replication_off_for_all_without_a_deadlock(root: Path) -> None:
    job = Job(root, "save", steps=2, persist="2", NO_SHM_RANK="1")
    assert job.outputs() == ["replicated None"] * WORLD
    assert "replicas=1 is off for every rank: rank 1 has no shared-memory folder" in job.stderr
    assert not list((root / "shm").rglob("*.replica-*"))
    restored = Job(root, "restore", NO_SHM_RANK="1").outputs()
    assert restored == ["restored 2 memory", "restored 2 disk", "restored 2 memory", "restored 2 memory"]


def free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as probe:
        return int(probe.getsockname()[1])


@pytest.mark.parametrize("where", ["a port every rank of this host asks for", "an address this host does not have"])
def test_ranks_that_cannot_listen_turn_replication_off_for_all_without_a_deadlock(root: Path, where: str) -> None:
    port = free_port()
    if where.startswith("a port"):  # no LOCAL_RANK: the four ranks of this host all want the same port
        env, reason = {"KCOVER_REPLICA_PORT": str(port)}, f"cannot listen on 127.0.0.1 port {port}: Address already"
    else:  # TEST-NET-1, never a local address
        env, reason = {"KCOVER_REPLICA_HOST": "192.0.2.1"}, "cannot listen on 192.0.2.1 port any: Cannot assign"
    job = Job(root, "save", steps=2, **env)
    assert job.outputs() == ["replicated None"] * WORLD
    assert "replicas=1 is off for every rank: rank " in job.stderr and reason in job.stderr, job.stderr
    assert not list((root / "shm").rglob("*.replica-*"))


@pytest.mark.parametrize(("base", "local", "port"), [("", "3", 0), ("29600", "", 29600), ("29600", "7", 29607),
                                                     ("65535", "0", 65535)])
def test_the_replica_port_is_the_base_plus_the_local_rank(monkeypatch: pytest.MonkeyPatch, base: str, local: str,
                                                          port: int) -> None:
    monkeypatch.setenv("KCOVER_REPLICA_PORT", base)
    monkeypatch.setenv("LOCAL_RANK", local)
    assert replica_port() == port


@pytest.mark.parametrize(("base", "local"), [("0", "0"), ("-1", "0"), ("65535", "1"), ("http", "0"),
                                             ("２９６００", "0"), ("29600", "x"), ("1e4", "0"), ("9" * 40, "0")])
def test_a_replica_port_that_is_no_port_is_named(monkeypatch: pytest.MonkeyPatch, base: str, local: str) -> None:
    monkeypatch.setenv("KCOVER_REPLICA_PORT", base)
    monkeypatch.setenv("LOCAL_RANK", local)
    with pytest.raises(ValueError, match=r"KCOVER_REPLICA_PORT=.* with LOCAL_RANK=.* is no port \(1-65535\)"):
        replica_port()


def test_replicas_need_torch_distributed_and_are_off_for_one_rank(tmp_path: Path, shm_dir: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(CheckpointError, match=r"replicas=1 needs torch\.distributed: create the Checkpointer after"):
        Checkpointer(tmp_path, rank=0, world_size=2, shared_memory=shm_dir, replicas=1, emergency_save=False)
    with Checkpointer(tmp_path, rank=0, world_size=1, shared_memory=shm_dir, replicas=1,
                      emergency_save=False) as alone:
        assert alone.save(1, make_state(1)) and alone.wait()
    assert "the job has one rank: replication is off" in caplog.text


@pytest.mark.parametrize(("replicas", "bandwidth", "message"), [
    (-1, None, "replicas must be a whole number ≥ 0, not -1"),
    (1.5, None, "replicas must be a whole number ≥ 0, not 1.5"),
    (True, None, "replicas must be a whole number ≥ 0, not True"),
    (1, 0, r"replica_bandwidth must be a number of bytes per second ≥ 1e\+06 \(1 MB/s\), or None; not 0"),
    (1, 100, "not 100"),
    (1, -5.0, "not -5.0"),
    (1, float("nan"), "not nan"),
    (1, float("inf"), "not inf"),
    (1, "1GB", "not '1GB'"),
])
def test_bad_replica_options_are_refused_by_name(tmp_path: Path, replicas: object, bandwidth: object,
                                                 message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Checkpointer(tmp_path, replicas=replicas, replica_bandwidth=bandwidth, shared_memory=None,  # type: ignore[arg-type]
                     emergency_save=False)
    assert not list(tmp_path.iterdir()) or all(p.name.startswith(".kcover") for p in tmp_path.iterdir())
