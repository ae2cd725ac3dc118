"""Warm standby on real nodes: a blamed node's rank moves to a standby pod; the other pod restarts in place.

A 2-rank gloo DDP Job with ``kcover.io/standby: "1"`` runs three pods under
``kcover pod --assigned-rank`` on four real nodes; the operator writes each
pod's ``kcover.io/rank``.  Rank 1 pauses after step 12 (so both ranks hold
step 12 and nothing newer), then its node gets an Xid 79 and its trainer is
killed: the agent there reports, the operator quarantines the node, deletes its
pod, hands rank 1 to the standby pod (already running, torch imported) with
generation 1 and orders generation 1 on rank 0's pod.  Rank 0 restores step 12
from its own memory, the standby fetches rank 1's replica from rank 0's
keeper (each node's shared memory is a folder of its own; nothing is ever
persisted), the job finishes, the Job controller's replacement pod for the
lost one stands by and is released with ``done``, and the Job completes.
Nothing here acts on the pods' behalf.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest
from tests.cluster.test_real_training import KMSG_XID, index_of, kcover_watching, recovery

from kcover.testing import TestCluster
from kcover.testing.realjobs import RESUMED, kill_trainers_on, pod_log, pods_of, trainer_job
from kcover.testing.realnodes import RealNodePool

pytestmark = pytest.mark.real_node

ROOT = Path(__file__).resolve().parents[2]
RUNNING_ONE = re.compile(r" stdout F kcover-pod: generation=1 state=running")


def rank_of(pod: dict[str, Any]) -> str | None:
    return (pod["metadata"].get("annotations") or {}).get("kcover.io/rank")


def test_a_blamed_nodes_rank_moves_to_the_warm_standby_and_the_other_pod_restarts_in_place(
        test_cluster: TestCluster, test_namespace: str, tmp_path: Path) -> None:
    pool = RealNodePool(test_cluster, test_cluster.binaries.path("kubelet"))
    try:
        nodes = pool.add(4, prefix="standby-")
        (tmp_path / "ckpt").mkdir()
        (tmp_path / "ckpt" / "pause-once").touch()
        with kcover_watching(test_cluster, pool, nodes, test_namespace, tmp_path):
            job = trainer_job("standby", test_namespace, pool, 2, checkpoints=tmp_path / "ckpt", prefer=nodes[:3],
                              opted_in=True, node_memory=tmp_path / "node-memory", standby=1, project_root=ROOT,
                              env={"STEPS": "40", "PERSIST_EVERY": "1000", "STEP_SECONDS": "0.15", "REPLICAS": "1",
                                   "HANG_FILE": "/ckpt/pause-once", "HANG_AFTER": "12", "HANG_RANK": "1"})
            test_cluster.api.post(f"/apis/batch/v1/namespaces/{test_namespace}/jobs", job)

            def paused() -> list[dict[str, Any]] | None:
                pods = pods_of(test_cluster, test_namespace, "standby")
                logs = [pod_log(pool, p) for p in pods]
                ready = (len(pods) == 3 and any("rank 1 stops stepping after step 12" in text for text in logs)
                         and any("state=standby" in text for text in logs))
                return pods if ready else None

            first = test_cluster.wait_for(paused, 180, "rank 1 paused after step 12 and a pod standing by")
            assert sorted(str(rank_of(p)) for p in first) == ["0", "1", "standby"]
            victim = next(p for p in first if rank_of(p) == "1")
            spare = next(p for p in first if rank_of(p) == "standby")
            bad = victim["spec"]["nodeName"]
            time.sleep(1.0)  # the paused rank's last replica is on its way (a few kB)
            with (tmp_path / f"{bad}.kmsg").open("a") as kmsg:
                kmsg.write(KMSG_XID)
            began = time.monotonic()
            assert kill_trainers_on(pool, bad)
            state = test_cluster.wait_for(lambda: (r := recovery(test_cluster, test_namespace, "standby"))
                                          .get("restarts") == 1 and r.get("phase") == "running" and r, 120,
                                          "the operator's standby restart")
            moved = time.monotonic() - began
            assert state["method"] == "standby" and state["quarantine"] == [bad], state
            assert state["takeover"] == [[spare["metadata"]["uid"], 1]], state
            assert test_cluster.api.get(f"/api/v1/nodes/{bad}")["spec"].get("unschedulable") is True

            def complete() -> dict[str, Any] | None:
                body = test_cluster.api.get(f"/apis/batch/v1/namespaces/{test_namespace}/jobs/standby")
                done = any(c.get("type") == "Complete" and c.get("status") == "True"
                           for c in body.get("status", {}).get("conditions") or [])
                return body if done else None

            test_cluster.wait_for(complete, 240, "the Job to complete")
        pods = {p["metadata"]["uid"]: p for p in pods_of(test_cluster, test_namespace, "standby")}
        taker = pods[spare["metadata"]["uid"]]
        assert rank_of(taker) == "1" and RUNNING_ONE.search(pod_log(pool, taker))
        taken = [(int(m.group(1)), m.group(2)) for m in RESUMED.finditer(pod_log(pool, taker))]
        keeper = next(p for p in pods.values() if rank_of(p) == "0")
        kept = [(int(m.group(1)), m.group(2)) for m in RESUMED.finditer(pod_log(pool, keeper))]
        assert len(taken) == 1 and len(kept) == 2 and kept[0] == (0, "scratch")  # generation 1 in the same pod
        # Both ranks resume step 12: the standby from rank 0's keeper, rank 0 from its own memory.  (Both once
        # resumed from scratch in CI: the checkpoint dir's id, made through a file named by the pid, which is
        # the same in every container; tests/checkpoint/test_dir_token.py.)
        assert taken[0] == (12, "peer") and kept[1] == (12, "memory"), (taken, kept)
        assert keeper["metadata"]["uid"] in {p["metadata"]["uid"] for p in first}  # the same pod, in place
        refill = [p for p in pods.values() if p["metadata"]["uid"] not in {q["metadata"]["uid"] for q in first}]
        assert [(index_of(p), rank_of(p), p["status"]["phase"]) for p in refill] == [
            (index_of(victim), "done", "Succeeded")]
        assert refill[0]["spec"]["nodeName"] != bad  # the pool refills elsewhere: the blamed node is cordoned
        assert not list((tmp_path / "ckpt").glob("step-*"))  # nothing was ever on disk
        print(f"node blamed -> operator's standby restart recorded: {moved:.2f} s")
    finally:
        left = pool.stop()
    assert left == []
