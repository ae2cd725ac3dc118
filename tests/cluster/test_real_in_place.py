"""In-place restart on real nodes: a crashed rank, and every pod's workers restart without a new pod.

The pods run ``kcover pod -- python -m kcover.testing.trainer`` with the pod's
``kcover.io/generation`` mounted by the downward API, as the README shows.  A
rank is SIGKILLed; the agent reads ``kcover pod``'s report of it from the real
container log, the operator orders generation 1 on both pods, the kubelet
rewrites the mounted file, and each ``kcover pod`` restarts its trainer, which
restores from the snapshot that stayed in the pod's memory.  Nothing here acts
on the pods' behalf: the test only kills the rank and reads what happened.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from tests.cluster.test_real_training import finished_again, kcover_watching, ranks_past, recovery

from kcover.k8s.names import IN_PLACE_TIMEOUT
from kcover.testing import TestCluster, node_cleanup
from kcover.testing._rest import ApiError
from kcover.testing.realjobs import kill_trainers_on, pod_log, pods_of, trainer_job
from kcover.testing.realnodes import RealNodePool

pytestmark = pytest.mark.real_node

ROOT = Path(__file__).resolve().parents[2]
GENERATION_ONE = re.compile(r" stdout F kcover-pod: generation=1 state=running")
RESUMED_AFTER = re.compile(r" stdout F resumed from step (\d+) \((\w+)\)")


def test_a_crashed_rank_restarts_every_pods_workers_in_place_from_memory(
        test_cluster: TestCluster, real_nodes: RealNodePool, test_namespace: str, tmp_path: Path) -> None:
    nodes = sorted(real_nodes.nodes)
    job = trainer_job("inplace", test_namespace, real_nodes, 2, checkpoints=tmp_path / "ckpt", prefer=nodes,
                      opted_in=True, in_place=True, project_root=ROOT,
                      env={"STEPS": "60", "PERSIST_EVERY": "5", "STEP_SECONDS": "0.15"})
    with kcover_watching(test_cluster, real_nodes, nodes, test_namespace, tmp_path):
        test_cluster.api.post(f"/apis/batch/v1/namespaces/{test_namespace}/jobs", job)
        first = ranks_past(test_cluster, real_nodes, test_namespace, "inplace", 12)
        uids = {p["metadata"]["uid"] for p in first}
        victim = next(p for p in first
                      if p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"] == "1")
        assert kill_trainers_on(real_nodes, victim["spec"]["nodeName"])
        state = test_cluster.wait_for(lambda: (r := recovery(test_cluster, test_namespace, "inplace"))
                                      .get("restarts") == 1 and r.get("phase") == "running" and r, 120,
                                      "the operator's in-place restart")
        assert state["method"] == "in-place" and state["generation"] == 1, state
        assert state["why"] == "in place: no node blamed, 2 pods run kcover pod"
        # generation 0 was productive from its first step to the checkpoint both pods had (every 5 steps of
        # 0.15 s; the kill came after step 12): the record keeps it for the job's ETTR
        assert 0 < state["productive"] < 60 and state["began"], state
        done = test_cluster.wait_for(
            lambda: (p := pods_of(test_cluster, test_namespace, "inplace"))
            and all(x["status"].get("phase") == "Succeeded" for x in p) and p, 180, "both pods to finish")
    assert {p["metadata"]["uid"] for p in done} == uids  # the same pods: nothing was recreated
    resumed = []
    texts = [pod_log(real_nodes, pod) for pod in done]
    for pod in done:
        text = pod_log(real_nodes, pod)
        restarted = GENERATION_ONE.search(text)
        assert restarted, text[-2000:]
        found = RESUMED_AFTER.search(text, restarted.end())
        assert found, text[restarted.end():][:2000]
        resumed.append((int(found.group(1)), found.group(2)))
        assert "stdout F done" in text
        pod_state = json.loads(pod["metadata"]["annotations"]["kcover.io/pod-state"])
        assert pod_state["generation"] == 1 and pod_state["state"] in ("running", "done")
    # every rank from one agreed step: the memory snapshots, unless the kill fell between two ranks' saves of a
    # step (each rank keeps its newest snapshot only), then the newest checkpoint on disk (every 5 steps)
    steps = {step for step, _ in resumed}
    assert len(steps) == 1 and min(steps) >= 10, (resumed, [t[-3000:] for t in texts])
    assert {source for _, source in resumed} <= {"memory", "disk"}, resumed
    for node in nodes:
        assert not test_cluster.api.get(f"/api/v1/nodes/{node}")["spec"].get("unschedulable")


def kcover_pod_process(pool: RealNodePool, node: str) -> int:
    """The ``kcover pod`` process in ``node``'s container (found through the node's cgroups)."""
    for pid in node_cleanup.cgroup_pids(pool.nodes[node].cgroup_root):
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            arguments = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
            if arguments[1:4] == ["-m", "kcover", "pod"]:
                return pid
    raise AssertionError(f"no kcover pod process on {node}")


def test_a_pod_that_never_reaches_the_new_generation_gets_the_pods_restarted(
        test_cluster: TestCluster, real_nodes: RealNodePool, test_namespace: str, tmp_path: Path) -> None:
    """Rank 0's ``kcover pod`` is frozen (SIGSTOP) when rank 1 crashes: it never sees the order, so after the
    job's in-place timeout the operator restarts the pods instead, says why, and the job still finishes."""
    nodes = sorted(real_nodes.nodes)
    job = trainer_job("stuck", test_namespace, real_nodes, 2, checkpoints=tmp_path / "ckpt", prefer=nodes,
                      opted_in=True, in_place=True, project_root=ROOT, grace=5,
                      env={"STEPS": "60", "PERSIST_EVERY": "5", "STEP_SECONDS": "0.15"})
    job["metadata"]["annotations"] = {IN_PLACE_TIMEOUT: "5"}
    with kcover_watching(test_cluster, real_nodes, nodes, test_namespace, tmp_path):
        test_cluster.api.post(f"/apis/batch/v1/namespaces/{test_namespace}/jobs", job)
        first = ranks_past(test_cluster, real_nodes, test_namespace, "stuck", 12)
        index = {p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]: p for p in first}
        frozen = kcover_pod_process(real_nodes, index["0"]["spec"]["nodeName"])
        os.kill(frozen, signal.SIGSTOP)
        try:
            assert kill_trainers_on(real_nodes, index["1"]["spec"]["nodeName"])
            state = test_cluster.wait_for(lambda: (r := recovery(test_cluster, test_namespace, "stuck"))
                                          .get("restarts") == 1 and r.get("phase") == "running" and r, 120,
                                          "the restart")
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(frozen, signal.SIGCONT)
        assert state["method"] != "in-place", state
        assert state["why"].startswith("pods restarted: generation 1 not running in every pod after"), state
        renewed, step = finished_again(test_cluster, real_nodes, test_namespace, "stuck",
                                       {p["metadata"]["uid"] for p in first})
    assert len(renewed) == 2 and 10 <= step < 60
    events = test_cluster.api.get(f"/api/v1/namespaces/{test_namespace}/events")["items"]
    assert any(e["reason"] == "KcoverInPlaceEscalated" for e in events)


def test_kcover_inject_crashes_a_rank_through_the_agent_and_the_job_restarts_in_place(
        test_cluster: TestCluster, real_nodes: RealNodePool, test_namespace: str, tmp_path: Path) -> None:
    """``kcover inject NS/JOB crash@rank1`` as an admin: the agent on rank 1's node writes the order on its pod,
    that pod's ``kcover pod`` kills its trainer, and the real failure path follows (in place, no new pods)."""
    test_cluster.install_crds([ROOT / "charts" / "kcover" / "crds" / "faultinjections.kcover.io.yaml"])
    with contextlib.suppress(ApiError):
        test_cluster.api.post("/api/v1/namespaces", {"metadata": {"name": "kcover-system"}})
    nodes = sorted(real_nodes.nodes)
    job = trainer_job("rehearse", test_namespace, real_nodes, 2, checkpoints=tmp_path / "ckpt", prefer=nodes,
                      opted_in=True, in_place=True, project_root=ROOT,
                      env={"STEPS": "60", "PERSIST_EVERY": "1000", "STEP_SECONDS": "0.15"})
    with kcover_watching(test_cluster, real_nodes, nodes, test_namespace, tmp_path):
        test_cluster.api.post(f"/apis/batch/v1/namespaces/{test_namespace}/jobs", job)
        first = ranks_past(test_cluster, real_nodes, test_namespace, "rehearse", 12)
        done = subprocess.run([sys.executable, "-m", "kcover", "inject", f"{test_namespace}/rehearse", "crash@rank1",
                               "--kubeconfig", str(test_cluster.kubeconfig)],
                              capture_output=True, text=True, timeout=90, check=False)
        assert done.returncode == 0, done.stderr
        state = test_cluster.wait_for(lambda: (r := recovery(test_cluster, test_namespace, "rehearse"))
                                      .get("restarts") == 1 and r.get("phase") == "running" and r, 120,
                                      "the in-place restart")
        assert state["method"] == "in-place", state
        finished = test_cluster.wait_for(
            lambda: (p := pods_of(test_cluster, test_namespace, "rehearse"))
            and all(x["status"].get("phase") == "Succeeded" for x in p) and p, 180, "both pods to finish")
    assert {p["metadata"]["uid"] for p in finished} == {p["metadata"]["uid"] for p in first}
    rank1 = next(p for p in finished
                 if p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"] == "1")
    assert "kcover pod: injecting crash into rank 1" in pod_log(real_nodes, rank1)
