"""Warm standby vs none on real nodes: a node blamed → every rank stepping again.

``python -m bench.k8s_standby --trials 3``.  On the test control plane with four
real nodes (containerd + runc + kubelet), a 2-rank gloo DDP job runs ``kcover
pod -- python -m kcover.testing.trainer`` (a memory snapshot every step, a disk
checkpoint every 10), watched by the real operator and one agent per node.
Each trial starts the job, waits until it steps steadily (and the warm workers
have had time to import), writes an Xid 79 into one rank's node kernel log and
SIGKILLs that rank, then times from the fault until every rank has restored
and printed a step again.  Trials alternate between two jobs alike but for
``kcover.io/standby``, so both meet the same machine load:

- **standby**: one more pod, a warm standby under ``kcover pod
  --assigned-rank``; the blamed node's rank moves to it and the other pod
  restarts in place;
- **none**: the job's pods are restarted without the blamed node (a new pod
  is scheduled, started and imports torch: kcover's way before standby).

A trial in which a rank steps again on the blamed node is an error, not a
figure (the restart method is printed with each trial).  The blamed node is
released after each trial and the job deleted.  Also printed:
the operator's decision (its claim), from the same fault.  The job's
RecoveryPolicy sets no backoff between restarts.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.k8s_in_place import moments, record
from bench.k8s_real_restart import KMSG_XID, attempt, release, start_kcover, wait
from kcover.testing import TestCluster, find_binaries
from kcover.testing.realjobs import kill_trainers_on, pod_log, pods_of, trainer_job
from kcover.testing.realnodes import RealNodePool

ROOT = Path(__file__).resolve().parents[1]
JOB = "train"
RANKS = 2
NODES = 4


def ranks_pods(cluster: TestCluster, namespace: str) -> list[dict[str, Any]]:
    """The live pods that run a rank (a standby job's standbys excluded)."""
    pods = [p for p in pods_of(cluster, namespace, JOB) if not p["metadata"].get("deletionTimestamp")
            and p["status"].get("phase") in ("Pending", "Running")]
    assigned = [(p["metadata"].get("annotations") or {}).get("kcover.io/rank") for p in pods]
    return [p for p, rank in zip(pods, assigned, strict=True) if rank is None or rank.isdigit()]


def stepping_since(cluster: TestCluster, pool: RealNodePool, namespace: str, since: float) -> bool:
    """Every rank restored and printed a step after ``since`` (epoch seconds)."""
    pods = ranks_pods(cluster, namespace)
    return len(pods) == RANKS and all("first step" in moments(pod_log(pool, p), since) for p in pods)


def one_trial(cluster: TestCluster, pool: RealNodePool, namespace: str, root: Path, trial: int,
              standby: int) -> tuple[float, float, str]:
    """Start the job, fault one rank's node; the seconds to the operator's claim and to every rank stepping."""
    job = trainer_job(JOB, namespace, pool, RANKS, checkpoints=root / f"ckpt-{trial}-{standby}", opted_in=True,
                      in_place=True, standby=standby, project_root=ROOT,
                      env={"STEPS": "1000000", "PERSIST_EVERY": "10", "STEP_SECONDS": "0.1"})
    job["metadata"]["annotations"]["kcover.io/max-restarts"] = "100"
    cluster.api.post(f"/apis/batch/v1/namespaces/{namespace}/jobs", job)
    wait(lambda: stepping_since(cluster, pool, namespace, time.time() - 1.0))
    time.sleep(12)  # steady: the warm workers (and the standby's) have done their imports
    victim = sorted(ranks_pods(cluster, namespace), key=lambda p: p["metadata"]["name"])[trial % RANKS]
    node = victim["spec"]["nodeName"]
    before = attempt(cluster, namespace) or 1
    began, started = time.time(), time.monotonic()
    with (root / f"{node}.kmsg").open("a") as kmsg:
        kmsg.write(KMSG_XID)
    assert kill_trainers_on(pool, node), "no trainer to kill"
    decided = wait(lambda: (now := attempt(cluster, namespace)) is None or now > before) - started
    stepped = wait(lambda: stepping_since(cluster, pool, namespace, began)) - started
    method = str(record(cluster, namespace).get("method"))
    where = {p["spec"].get("nodeName") for p in ranks_pods(cluster, namespace)}
    assert node not in where, f"trial {trial}: a rank stepped again on the blamed node {node}: {method} restart"
    cluster.api.request("DELETE", f"/apis/batch/v1/namespaces/{namespace}/jobs/{JOB}",
                        body={"propagationPolicy": "Foreground", "gracePeriodSeconds": 0})
    wait(lambda: not pods_of(cluster, namespace, JOB))
    wait(lambda: not any(j["metadata"]["name"] == JOB for j in
                         cluster.api.get(f"/apis/batch/v1/namespaces/{namespace}/jobs")["items"]))
    release(cluster, node)
    return decided, stepped, method


def run(trials: int) -> None:
    began = time.monotonic()
    with tempfile.TemporaryDirectory() as folder, TestCluster(find_binaries()) as cluster:
        root = Path(folder)
        nodes = cluster.add_real_nodes(NODES)
        pool = cluster.real_node_pool
        assert pool is not None
        namespace = cluster.create_namespace("bench")
        cluster.install_crds([ROOT / "charts" / "kcover" / "crds" / "recoverypolicies.kcover.io.yaml"])
        cluster.api.post(f"/apis/kcover.io/v1alpha1/namespaces/{namespace}/recoverypolicies", {
            "apiVersion": "kcover.io/v1alpha1", "kind": "RecoveryPolicy", "metadata": {"name": "default"},
            "spec": {"backoffSeconds": 0, "maxRestarts": 1000}})
        processes = start_kcover(cluster, pool, nodes, namespace, root)
        rows: dict[int, list[tuple[float, float, str]]] = {1: [], 0: []}
        try:
            for trial in range(trials):
                for standby in (1, 0):
                    rows[standby].append(one_trial(cluster, pool, namespace, root, trial, standby))
        finally:
            for process in processes:
                process.terminate()
            for process in processes:
                process.wait(timeout=20)
    print(f"{RANKS}-rank gloo DDP job under kcover pod on {NODES} real nodes, {trials} trials of each way, "
          f"alternating ({time.monotonic() - began:.0f} s in all); an Xid 79 and a SIGKILLed rank -> every rank "
          "stepping again (s)")
    print("way       trial  operator's claim  every rank stepping  method")
    for standby, name in ((1, "standby"), (0, "none")):
        for index, (decided, stepped, method) in enumerate(rows[standby]):
            print(f"{name:<8}  {index:5d}  {decided:16.2f}  {stepped:19.2f}  {method}")
    fast = statistics.median(r[1] for r in rows[1])
    slow = statistics.median(r[1] for r in rows[0])
    print(f"median with a warm standby {fast:.2f} s, without {slow:.2f} s: ratio {fast / slow:.2f} "
          "(target <= 0.4)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=3)
    args = parser.parse_args()
    if args.trials < 1:
        raise SystemExit("--trials must be at least 1")
    run(args.trials)


if __name__ == "__main__":
    main()
