"""Real training in pods on real nodes: SIGTERM inside a pod, and the whole recovery story.

The pods run :mod:`kcover.testing.trainer` (gloo DDP, ``kcover.checkpoint``) with the host's
Python; the checkpoint folder is a hostPath every node mounts (shared storage).
Nothing here is written by the test on the pods' behalf: the kubelet's SIGTERM,
the Checkpointer's emergency save, the Job controller's replacement pod and the
restore are all the real programs'.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kcover.k8s.names import HANG_TIMEOUT
from kcover.testing import TestCluster
from kcover.testing._rest import ApiError
from kcover.testing.realjobs import RESUMED, kill_trainers_on, last_step, pod_log, pods_of, trainer_job
from kcover.testing.realnodes import RealNodePool

pytestmark = pytest.mark.real_node

ROOT = Path(__file__).resolve().parents[2]


def test_sigterm_in_a_pod_writes_the_emergency_checkpoint_and_the_new_pod_resumes_from_it(
        test_cluster: TestCluster, real_nodes: RealNodePool, test_namespace: str, tmp_path: Path) -> None:
    """Deleting a pod mid-training: the kubelet's SIGTERM makes the worker persist its newest snapshot
    (periodic persists are 1,000 steps apart, so any checkpoint on disk is the emergency one) within the
    grace period, and the replacement pod restores exactly that step from disk."""
    env = {"STEPS": "100000", "PERSIST_EVERY": "1000", "STEP_SECONDS": "0.05"}
    job = trainer_job("sigterm", test_namespace, real_nodes, 1, checkpoints=tmp_path / "ckpt", env=env, grace=20,
                      project_root=ROOT)
    test_cluster.api.post(f"/apis/batch/v1/namespaces/{test_namespace}/jobs", job)
    first = test_cluster.wait_for(lambda: (p := pods_of(test_cluster, test_namespace, "sigterm"))
                                  and last_step(pod_log(real_nodes, p[0])) >= 20 and p[0], 120,
                                  "the first pod past step 20")
    seen = last_step(pod_log(real_nodes, first))
    began = time.monotonic()
    test_cluster.api.request("DELETE", f"/api/v1/namespaces/{test_namespace}/pods/{first['metadata']['name']}")

    def replacement() -> dict[str, Any] | None:
        for pod in pods_of(test_cluster, test_namespace, "sigterm"):
            if pod["metadata"]["uid"] != first["metadata"]["uid"] and RESUMED.search(pod_log(real_nodes, pod)):
                return pod
        return None

    test_cluster.wait_for(lambda: first["metadata"]["uid"] not in
                          {p["metadata"]["uid"] for p in pods_of(test_cluster, test_namespace, "sigterm")}, 60,
                          "the deleted pod to go")
    ended = time.monotonic() - began
    assert ended < 10, f"the worker took {ended:.1f} s of its 20 s grace: did SIGTERM end it (PID 1)?"
    new = test_cluster.wait_for(replacement, 120, "a replacement pod that resumed")
    match = RESUMED.search(pod_log(real_nodes, new))
    assert match is not None
    step, source = int(match.group(1)), match.group(2)
    assert source == "disk"
    assert step >= seen > 0  # not a periodic checkpoint (none before step 1000): the SIGTERM one
    saved = sorted((tmp_path / "ckpt").glob("step-*"))
    assert [int(p.name.split("-")[1]) for p in saved] == [step]
    assert time.monotonic() - began < 120
    test_cluster.api.request("DELETE", f"/apis/batch/v1/namespaces/{test_namespace}/jobs/sigterm",
                             body={"propagationPolicy": "Background"})


POLICY_CRD = ROOT / "charts" / "kcover" / "crds" / "recoverypolicies.kcover.io.yaml"
KMSG_XID = "3,2045,91234567,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, GPU has fallen off the bus.\n"


def recovery(cluster: TestCluster, namespace: str, job: str) -> dict[str, Any]:
    try:
        body = cluster.api.get(f"/apis/batch/v1/namespaces/{namespace}/jobs/{job}")
    except ApiError:
        return {}
    return dict(json.loads((body["metadata"].get("annotations") or {}).get("kcover.io/recovery", "{}")))


@contextlib.contextmanager
def kcover_watching(cluster: TestCluster, pool: RealNodePool, nodes: list[str], namespace: str,
                    tmp_path: Path) -> Iterator[None]:
    """The operator and one agent per real node, as ``kcover`` processes (each node's kernel log is a
    file ``<tmp_path>/<node>.kmsg``); stopped at the end.  The namespace's RecoveryPolicy lets the operator
    quarantine any share of the nodes: the circuit breaker counts every node quarantined in the last hour,
    and the KWOK nodes of earlier tests in this session may be among them (a standby test's blamed node
    once stayed schedulable, and the pool's new pod landed on it)."""
    cluster.install_crds([POLICY_CRD])
    with contextlib.suppress(ApiError):  # already there: a second use in the same namespace
        cluster.api.post(f"/apis/kcover.io/v1alpha1/namespaces/{namespace}/recoverypolicies", {
            "apiVersion": "kcover.io/v1alpha1", "kind": "RecoveryPolicy", "metadata": {"name": "default"},
            "spec": {"quarantineMaxShare": 1.0}})
    started: list[subprocess.Popen[bytes]] = []
    with contextlib.ExitStack() as stack:
        def kcover(args: list[str], name: str) -> None:
            handle = stack.enter_context((tmp_path / f"{name}.log").open("wb"))
            started.append(subprocess.Popen([sys.executable, "-m", "kcover", *args], stdout=handle,
                                            stderr=subprocess.STDOUT))

        try:
            kcover(["operator", "--kubeconfig", str(cluster.kubeconfig), "--namespace", namespace,
                    "--lease-seconds", "3", "--identity", "op-real"], "operator")
            for node in nodes:
                (tmp_path / f"{node}.kmsg").touch()
                kcover(["agent", "--node", node, "--log-root", str(pool.nodes[node].pod_logs), "--kmsg",
                        str(tmp_path / f"{node}.kmsg"), "--state-dir", str(tmp_path / f"agent-{node}"),
                        "--kubeconfig", str(cluster.kubeconfig), "--health-interval", "0"], f"agent-{node}")
            yield
        finally:
            for process in started:
                process.send_signal(signal.SIGTERM)
            for process in started:
                try:
                    process.wait(15)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()


def two_rank_job(name: str, namespace: str, pool: RealNodePool, nodes: list[str], tmp_path: Path,
                 **env: str) -> dict[str, Any]:
    """An opted-in 2-rank Job on ``pool``, preferring ``nodes`` for its first attempt."""
    return trainer_job(name, namespace, pool, 2, checkpoints=tmp_path / "ckpt", prefer=nodes, opted_in=True,
                       project_root=ROOT, env={"STEPS": "70", "PERSIST_EVERY": "5", "STEP_SECONDS": "0.15", **env})


def ranks_past(cluster: TestCluster, pool: RealNodePool, namespace: str, job: str,
               step: int) -> list[dict[str, Any]]:
    return list(cluster.wait_for(
        lambda: (p := pods_of(cluster, namespace, job)) and len(p) == 2
        and all(last_step(pod_log(pool, x)) >= step for x in p) and p, 180, f"both ranks past step {step}"))


def finished_again(cluster: TestCluster, pool: RealNodePool, namespace: str, job: str,
                   old: set[str]) -> tuple[list[dict[str, Any]], int]:
    """Wait for two pods newer than ``old`` to finish; return them and the step both resumed from."""
    def finished() -> list[dict[str, Any]] | None:
        pods = [p for p in pods_of(cluster, namespace, job) if p["metadata"]["uid"] not in old]
        done = [p for p in pods if p["status"].get("phase") == "Succeeded"]
        return done if len(done) == 2 else None

    renewed = cluster.wait_for(finished, 240, "two new pods to finish the training")
    resumed = [RESUMED.search(pod_log(pool, p)) for p in renewed]
    steps = {int(m.group(1)) for m in resumed if m}
    assert len(steps) == 1 and all(resumed), resumed  # every rank resumed, all from one agreed step
    assert all("stdout F done" in pod_log(pool, p) for p in renewed)
    return renewed, steps.pop()


def index_of(pod: dict[str, Any]) -> str:
    return str(pod["metadata"]["annotations"].get("batch.kubernetes.io/job-completion-index"))


def test_whole_story_xid_on_a_real_node_quarantines_it_and_training_resumes_elsewhere(
        test_cluster: TestCluster, test_namespace: str, tmp_path: Path) -> None:
    """Two-node gloo DDP Job on real nodes, opted in.  Node B's kernel log gets an Xid 79 and its rank is
    killed; the agent there reports, the operator quarantines B and restarts the job; the new pods run on
    A and a third node, resume from the shared checkpoint (step asserted) and finish."""
    pool = RealNodePool(test_cluster, test_cluster.binaries.path("kubelet"))
    try:
        nodes = pool.add(3, prefix="story-")
        with kcover_watching(test_cluster, pool, nodes, test_namespace, tmp_path):
            test_cluster.api.post(f"/apis/batch/v1/namespaces/{test_namespace}/jobs",
                                  two_rank_job("story", test_namespace, pool, nodes[:2], tmp_path))
            first = ranks_past(test_cluster, pool, test_namespace, "story", 12)
            victim = next(p for p in first if index_of(p) == "1")
            bad = victim["spec"]["nodeName"]
            good = next(p["spec"]["nodeName"] for p in first if p is not victim)
            with (tmp_path / f"{bad}.kmsg").open("a") as kmsg:
                kmsg.write(KMSG_XID)
            assert kill_trainers_on(pool, bad)
            state = test_cluster.wait_for(lambda: (r := recovery(test_cluster, test_namespace, "story"))
                                          .get("restarts") == 1 and r.get("phase") == "running" and r, 120,
                                          "the operator's restart")
            assert state["last"]["category"] == "gpu_hardware"
            assert state["last"]["nodes"] == [bad]
            renewed, step = finished_again(test_cluster, pool, test_namespace, "story",
                                           {p["metadata"]["uid"] for p in first})
        assert sorted(p["spec"]["nodeName"] for p in renewed) == sorted(set(nodes) - {bad})
        assert good in {p["spec"]["nodeName"] for p in renewed}
        assert 10 <= step < 70 and step % 5 == 0
        node_b = test_cluster.api.get(f"/api/v1/nodes/{bad}")
        assert node_b["spec"].get("unschedulable") is True
        assert "kcover.io/quarantine" in [t["key"] for t in node_b["spec"].get("taints") or []]
    finally:
        left = pool.stop()
    assert left == []


def test_a_lost_nodes_rank_resumes_on_a_new_node_from_its_buddys_memory(
        test_cluster: TestCluster, test_namespace: str, tmp_path: Path) -> None:
    """As above, with ``replicas=1`` and no periodic persist: each node's shared memory is a folder of its own,
    so rank 1's snapshot dies with node B.  Rank 1 pauses after step 12 (so both ranks hold step 12 and
    nothing newer: a rank killed between its peer's save of a step and its own would leave no step both can
    load, the known gap), then B fails.  The replacement pod on a new node fetches rank 1's replica from the
    buddy's node (a real TCP side channel between the pods) and the job resumes at step 12, not from
    scratch (the disk holds no step of rank 1 at all).  Which new pod lands on node A is the scheduler's
    choice: if it is rank 1's, rank 1 serves both rank 0's snapshot left there and its own replica."""
    pool = RealNodePool(test_cluster, test_cluster.binaries.path("kubelet"))
    try:
        nodes = pool.add(3, prefix="peer-")
        (tmp_path / "ckpt").mkdir()
        (tmp_path / "ckpt" / "pause-once").touch()
        with kcover_watching(test_cluster, pool, nodes, test_namespace, tmp_path):
            job = trainer_job("peer", test_namespace, pool, 2, checkpoints=tmp_path / "ckpt", prefer=nodes[:2],
                              opted_in=True, node_memory=tmp_path / "node-memory", project_root=ROOT,
                              env={"STEPS": "40", "PERSIST_EVERY": "1000", "STEP_SECONDS": "0.15", "REPLICAS": "1",
                                   "HANG_FILE": "/ckpt/pause-once", "HANG_AFTER": "12", "HANG_RANK": "1"})
            test_cluster.api.post(f"/apis/batch/v1/namespaces/{test_namespace}/jobs", job)
            first = test_cluster.wait_for(
                lambda: (p := pods_of(test_cluster, test_namespace, "peer")) and len(p) == 2
                and any("rank 1 stops stepping after step 12" in pod_log(pool, x) for x in p) and p, 180,
                "rank 1 to pause after step 12")
            victim = next(p for p in first if index_of(p) == "1")
            bad = victim["spec"]["nodeName"]
            time.sleep(1.0)  # the paused rank's last replica is on its way (a few kB; sent in milliseconds)
            with (tmp_path / f"{bad}.kmsg").open("a") as kmsg:
                kmsg.write(KMSG_XID)
            assert kill_trainers_on(pool, bad)
            try:
                renewed, step = finished_again(test_cluster, pool, test_namespace, "peer",
                                               {p["metadata"]["uid"] for p in first})
            finally:  # every pod's story and the operator's record, for the reader of a failure
                story = [f"{p['metadata']['name']} on {p['spec'].get('nodeName')}:\n{pod_log(pool, p)}"
                         for p in [*first, *pods_of(test_cluster, test_namespace, "peer")]]
                story.append(json.dumps(recovery(test_cluster, test_namespace, "peer"), indent=1))
                (tmp_path / "story.log").write_text("\n\n".join(story))
        assert bad not in {p["spec"]["nodeName"] for p in renewed}
        sources = {index_of(p): RESUMED.search(pod_log(pool, p)) for p in renewed}
        assert sources["1"] is not None and sources["1"].group(2) == "peer", tmp_path / "story.log"
        assert step == 12
        assert not list((tmp_path / "ckpt").glob("step-*/rank-00001.json"))  # nothing of rank 1 on disk
    finally:
        left = pool.stop()
    assert left == []


def test_a_rank_that_stops_stepping_is_found_in_real_logs_and_the_job_restarts(
        test_cluster: TestCluster, real_nodes: RealNodePool, test_namespace: str, tmp_path: Path) -> None:
    """Rank 1 stops stepping after step 15 (its peer then waits in the allreduce): the agent sees no new
    step in the real container logs for the job's hang timeout, the operator restarts the job, and it
    finishes from the last checkpoint.  No node is blamed for a hang."""
    nodes = sorted(real_nodes.nodes)
    (tmp_path / "ckpt").mkdir()
    hang = tmp_path / "ckpt" / "hang-once"
    hang.touch()
    job = two_rank_job("hang", test_namespace, real_nodes, nodes, tmp_path, HANG_FILE="/ckpt/hang-once",
                       HANG_AFTER="15", HANG_RANK="1", STEPS="40")
    job["metadata"]["annotations"] = {HANG_TIMEOUT: "4"}
    with kcover_watching(test_cluster, real_nodes, nodes, test_namespace, tmp_path):
        test_cluster.api.post(f"/apis/batch/v1/namespaces/{test_namespace}/jobs", job)
        first = ranks_past(test_cluster, real_nodes, test_namespace, "hang", 15)
        state = test_cluster.wait_for(lambda: (r := recovery(test_cluster, test_namespace, "hang"))
                                      .get("restarts") == 1 and r, 120, "the operator's restart after the hang")
        assert not hang.exists()  # the hang happened: rank 1 took the trigger
        assert state["last"]["category"] == "collective_timeout_hang", state
        assert state["last"]["rule"] == "job.no-progress"
        _, step = finished_again(test_cluster, real_nodes, test_namespace, "hang",
                                       {p["metadata"]["uid"] for p in first})
    assert 10 <= step <= 15
    assert not any(test_cluster.api.get(f"/api/v1/nodes/{n}")["spec"].get("unschedulable") for n in nodes)
