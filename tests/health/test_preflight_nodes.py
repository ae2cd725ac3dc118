"""``kcover preflight --pairwise``: one real process per "node", meeting through torchrun's variables.

Each process is the init container of one node: it runs its checks, takes its part in the
pairwise test (gloo over TCP), and refuses only when its own node is slow or failed, logging the
line the catalog's ``host.preflight-failed`` rule turns into a node-at-fault verdict.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kcover import explain
from kcover.ports import free_port


def preflight(node: str, rank: int, world: int, port: int, folder: Path, slowdown: float = 1.0,
              ) -> subprocess.Popen[str]:
    env = {**os.environ, "NODE_RANK": str(rank), "NNODES": str(world), "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(port), "KCOVER_PAIRWISE_SLOWDOWN": str(slowdown)}
    return subprocess.Popen([sys.executable, "-m", "kcover", "preflight", "--pairwise", "--node", node,
                             "--only", "storage.free", "--checkpoint-dir", str(folder)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_only_the_slow_node_refuses_and_says_so_in_a_line_the_catalog_knows(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    port = free_port()
    nodes = [preflight(f"gpu-{i}", i, 4, port, tmp_path, slowdown=8.0 if i == 2 else 1.0) for i in range(4)]
    outcomes = [(p.wait(timeout=120), *p.communicate()) for p in nodes]
    assert [code for code, _, _ in outcomes] == [0, 0, 1, 0], outcomes
    err = outcomes[2][2]
    assert "kcover preflight: node gpu-2 failed: slow in every pairing (gpu-2;" in err
    verdict = explain(err, source="gpu-2")
    assert verdict.rule == "host.preflight-failed" and verdict.node_at_fault
    assert all("failed" not in err for _, _, err in outcomes[:2] + outcomes[3:])


def test_pairwise_without_a_rendezvous_is_a_usage_error(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("NODE_RANK", "RANK", "NNODES", "WORLD_SIZE",
                                                            "MASTER_ADDR")}
    done = subprocess.run([sys.executable, "-m", "kcover", "preflight", "--pairwise", "--only", "storage.free",
                           "--checkpoint-dir", str(tmp_path)], env=env, capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 2
    assert "NODE_RANK" in done.stderr and "Traceback" not in done.stderr
