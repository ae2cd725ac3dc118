"""Restart latency with real containers: a fault on a real node → every rank stepping again.

``python -m bench.k8s_restart_latency --real-nodes 3`` runs this.  On the test
control plane with real nodes (containerd + runc + kubelet, see
:mod:`kcover.testing.realnodes`), a 2-rank gloo DDP job (``kcover.testing.trainer``,
checkpointing every 10 steps to a shared hostPath) runs one pod per node.  Each
trial writes an Xid 79 into one rank's node kernel log (the file the agent
follows) and SIGKILLs that rank, then times, from the fault:

- detection: the agent has recorded the fault on the pod;
- decision: the operator has claimed the restart on the job;
- old pods gone: every pod of the previous attempt has ended (deleted, or Failed/Succeeded);
- new pods created: the Job controller has made every new pod;
- containers running: every new pod's container is running (scheduled, sandbox and container started);
- first step: every new rank has restored its checkpoint and printed a step.

The baseline, in the same run and on the same cluster, is the same job restarted
by hand without kcover (suspend, wait for the pods to go, resume, wait until
every rank steps again): what Kubernetes, the containers, Python + torch import,
the rendezvous and the checkpoint load cost by themselves.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kcover.testing import TestCluster, find_binaries
from kcover.testing._core import wait_for
from kcover.testing._rest import ApiError
from kcover.testing.realjobs import RESUMED, kill_trainers_on, pod_log, pods_of, trainer_job
from kcover.testing.realnodes import RealNodePool

ROOT = Path(__file__).resolve().parents[1]
KMSG_XID = "3,2045,91234567,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, GPU has fallen off the bus.\n"
JOB = "train"


def wait(probe: Callable[[], Any]) -> float:
    """When ``probe`` first held (real containers take longer than KWOK's: four minutes at most)."""
    wait_for(probe, timeout=240, what="a benchmark step", interval=0.05)
    return time.monotonic()


def live(cluster: TestCluster, namespace: str) -> list[dict[str, Any]]:
    return [p for p in pods_of(cluster, namespace, JOB) if not p["metadata"].get("deletionTimestamp")
            and p["status"].get("phase") in ("Pending", "Running")]


def stepping(cluster: TestCluster, pool: RealNodePool, namespace: str, old: set[str], ranks: int) -> bool:
    """Every rank of a new attempt has resumed and printed a step after that."""
    fresh = [p for p in live(cluster, namespace) if p["metadata"]["uid"] not in old]
    if len(fresh) != ranks:
        return False
    for pod in fresh:
        text = pod_log(pool, pod)
        found = RESUMED.search(text)
        if found is None or " stdout F step " not in text[found.end():]:
            return False
    return True


def started(cluster: TestCluster, namespace: str, old: set[str], ranks: int) -> bool:
    fresh = [p for p in live(cluster, namespace) if p["metadata"]["uid"] not in old]
    return len(fresh) == ranks and all(
        "running" in (s.get("state") or {}) for p in fresh for s in p["status"].get("containerStatuses") or [])


def attempt(cluster: TestCluster, namespace: str) -> int | None:
    """The job's recovery attempt; None while the Job object is gone (the operator is replacing it)."""
    try:
        body = cluster.api.get(f"/apis/batch/v1/namespaces/{namespace}/jobs/{JOB}")
    except ApiError as error:
        if error.status == 404:
            return None
        raise
    return int(json.loads((body["metadata"].get("annotations") or {}).get("kcover.io/recovery", "{}"))
               .get("attempt", 1))


def fault_reported(cluster: TestCluster, namespace: str, pod: str) -> bool:
    """The agent's fault record on the pod (or the pod already deleted: only the operator's restart does that)."""
    try:
        return "kcover.io/faults" in (cluster.pod(namespace, pod)["metadata"].get("annotations") or {})
    except ApiError as error:
        if error.status == 404:
            return True
        raise


def by_hand(cluster: TestCluster, pool: RealNodePool, namespace: str, ranks: int) -> float:
    old = {p["metadata"]["uid"] for p in pods_of(cluster, namespace, JOB)}
    began = time.monotonic()
    path = f"/apis/batch/v1/namespaces/{namespace}/jobs/{JOB}"
    cluster.api.request("PATCH", path, {"spec": {"suspend": True}}, "application/merge-patch+json")
    wait(lambda: not live(cluster, namespace))
    cluster.api.request("PATCH", path, {"spec": {"suspend": False}}, "application/merge-patch+json")
    return wait(lambda: stepping(cluster, pool, namespace, old, ranks)) - began


def release(cluster: TestCluster, node: str) -> None:
    """Give a quarantined node back for the next trial."""
    cluster.api.request("PATCH", f"/api/v1/nodes/{node}", {
        "spec": {"unschedulable": None, "taints": [t for t in cluster.api.get(f"/api/v1/nodes/{node}")["spec"]
                                                   .get("taints") or [] if t["key"] != "kcover.io/quarantine"]},
        "metadata": {"annotations": {"kcover.io/quarantined": None, "kcover.io/quarantined-at": None}},
    }, "application/merge-patch+json")


def start_kcover(cluster: TestCluster, pool: RealNodePool, nodes: list[str], namespace: str,
                 root: Path) -> list[subprocess.Popen[bytes]]:
    """The operator and one agent per node (each node's kernel log is the file ``<root>/<node>.kmsg``)."""
    processes = [subprocess.Popen([sys.executable, "-m", "kcover", "operator", "--kubeconfig",
                                   str(cluster.kubeconfig), "--namespace", namespace],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    for node in nodes:
        (root / f"{node}.kmsg").touch()
        processes.append(subprocess.Popen(
            [sys.executable, "-m", "kcover", "agent", "--node", node, "--log-root",
             str(pool.nodes[node].pod_logs), "--kmsg", str(root / f"{node}.kmsg"), "--state-dir",
             str(root / f"agent-{node}"), "--kubeconfig", str(cluster.kubeconfig), "--health-interval", "0"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    return processes


def one_trial(cluster: TestCluster, pool: RealNodePool, namespace: str, root: Path, trial: int,
              ranks: int) -> tuple[float, ...]:
    """Fault one rank's node; return the seconds of each phase and the total (see the module docstring)."""
    pods = live(cluster, namespace)
    old = {p["metadata"]["uid"] for p in pods_of(cluster, namespace, JOB)}
    victim = pods[trial % len(pods)]
    node = victim["spec"]["nodeName"]
    claimed_before = attempt(cluster, namespace) or 1
    began = time.monotonic()
    with (root / f"{node}.kmsg").open("a") as kmsg:
        kmsg.write(KMSG_XID)
    kill_trainers_on(pool, node)
    detected = wait(lambda: fault_reported(cluster, namespace, victim["metadata"]["name"]))
    decided = wait(lambda: (now := attempt(cluster, namespace)) is None or now > claimed_before)
    gone = wait(lambda: not old & {p["metadata"]["uid"] for p in pods_of(cluster, namespace, JOB)
                                   if p["status"].get("phase") in ("Pending", "Running")})
    created = wait(lambda: len([p for p in live(cluster, namespace) if p["metadata"]["uid"] not in old]) == ranks)
    up = wait(lambda: started(cluster, namespace, old, ranks))
    stepped = wait(lambda: stepping(cluster, pool, namespace, old, ranks))
    release(cluster, node)
    time.sleep(2)
    return (detected - began, decided - detected, gone - decided, created - gone, up - created,
            stepped - up, stepped - began)


def run(real_nodes: int, trials: int) -> None:
    ranks = 2
    if real_nodes < ranks + 1:
        raise SystemExit("--real-nodes must be at least 3 (two ranks and a node to move to)")
    with tempfile.TemporaryDirectory() as folder, TestCluster(find_binaries()) as cluster:
        root = Path(folder)
        pool_began = time.monotonic()
        nodes = cluster.add_real_nodes(real_nodes)
        pool_seconds = time.monotonic() - pool_began
        pool = cluster.real_node_pool
        assert pool is not None
        namespace = cluster.create_namespace("bench")
        job = trainer_job(JOB, namespace, pool, ranks, checkpoints=root / "ckpt", opted_in=True,
                          project_root=ROOT, env={"STEPS": "1000000", "PERSIST_EVERY": "10",
                                                  "STEP_SECONDS": "0.1"})
        job["metadata"]["annotations"] = {"kcover.io/max-restarts": "100"}
        cluster.api.post(f"/apis/batch/v1/namespaces/{namespace}/jobs", job)
        first_began = time.monotonic()
        wait(lambda: stepping(cluster, pool, namespace, set(), ranks))
        cold = time.monotonic() - first_began
        baseline = [by_hand(cluster, pool, namespace, ranks) for _ in range(trials)]
        processes = start_kcover(cluster, pool, nodes, namespace, root)
        time.sleep(10)  # let the agents and the operator start and list
        try:
            rows = [one_trial(cluster, pool, namespace, root, trial, ranks) for trial in range(trials)]
        finally:
            for process in processes:
                process.terminate()
            for process in processes:
                process.wait(timeout=20)
    print(f"{ranks}-rank gloo DDP job on {real_nodes} real nodes (containerd + runc + kubelet), {trials} trials;"
          f" nodes ready in {pool_seconds:.1f} s, first start to first step {cold:.1f} s")
    print("trial  detection  decision  old pods gone  new pods created  containers running  first step  total (s)")
    for index, row in enumerate(rows):
        print(f"{index:5d}  {row[0]:9.2f}  {row[1]:8.2f}  {row[2]:13.2f}  {row[3]:16.2f}  {row[4]:18.2f}"
              f"  {row[5]:10.2f}  {row[6]:9.2f}")
    median = statistics.median(r[6] for r in rows)
    floor = statistics.median(baseline)
    print(f"median fault -> every rank stepping {median:.2f} s; restart by hand without kcover, same cluster:"
          f" {floor:.2f} s (trials {', '.join(f'{b:.2f}' for b in baseline)}); ratio {median / floor:.2f}")
