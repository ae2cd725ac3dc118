"""Kubernetes restart latency: a fault line in one pod's log → all pods of a 64-pod job recreated and Running.

On the real test control plane (KWOK nodes), with one ``kcover agent`` process
per node and the ``kcover operator``, each trial writes an Xid line into one
rank's CRI log and times where the time goes: agent (line → fault recorded on
the pod), operator (→ restart claimed on the job), API and controllers (→ every
old pod gone, → 64 new pods Running).  The baseline, measured in the same run,
is the same job restarted by hand (suspend, wait for the pods to go, resume):
what the API server, the Job controller, the scheduler and KWOK cost without
kcover.  Target: median ≤ 10 s.

    python -m bench.k8s_restart_latency [--trials 3] [--pods 64]
    python -m bench.k8s_restart_latency --real-nodes 3 [--trials 3]   # real containers: bench/k8s_real_restart.py
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from kubernetes import client, config

from kcover.testing import TestCluster, find_binaries

XID = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python, GPU has fallen off the bus."


def wait(probe: Callable[[], Any], timeout: float = 120) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if probe():
            return time.monotonic()
        time.sleep(0.05)
    raise TimeoutError("benchmark step did not finish")


def job_body(name: str, namespace: str, pods: int) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "namespace": namespace, "labels": {"kcover.io/cascading-recovery": "true"},
                         "annotations": {"kcover.io/max-restarts": "100"}},
            "spec": {"completions": pods, "parallelism": pods, "completionMode": "Indexed", "backoffLimit": 1000,
                     "podFailurePolicy": {"rules": [{"action": "Ignore",
                                                     "onExitCodes": {"operator": "NotIn", "values": [0]}}]},
                     "template": {"spec": {"restartPolicy": "Never", "nodeSelector": {"bench": "k8s"},
                                           "containers": [{"name": "trainer", "image": "trainer:v1",
                                                           "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}}}}


def running(core: client.CoreV1Api, namespace: str, pods: int, old: set[str]) -> bool:
    items = core.list_namespaced_pod(namespace, label_selector="batch.kubernetes.io/job-name=train").items
    fresh = [p for p in items if p.metadata.uid not in old and p.status.phase == "Running"
             and not p.metadata.deletion_timestamp]
    return len(fresh) == pods


def recorded(core: client.CoreV1Api, namespace: str, pod: str) -> bool:
    return "kcover.io/faults" in (core.read_namespaced_pod(pod, namespace).metadata.annotations or {})


def claimed(batch: client.BatchV1Api, namespace: str, attempt: int) -> bool:
    annotations = batch.read_namespaced_job("train", namespace).metadata.annotations or {}
    return int(json.loads(annotations.get("kcover.io/recovery", "{}")).get("attempt", 1)) >= attempt


def gone(core: client.CoreV1Api, namespace: str, old: set[str]) -> bool:
    return not any(p.metadata.uid in old for p in current(core, namespace))


def current(core: client.CoreV1Api, namespace: str) -> list[Any]:
    items = core.list_namespaced_pod(namespace, label_selector="batch.kubernetes.io/job-name=train").items
    return [p for p in items if p.status.phase == "Running" and not p.metadata.deletion_timestamp]


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--pods", type=int, default=64)
    parser.add_argument("--real-nodes", type=int, default=0,
                        help="run a 2-rank training on this many real nodes instead (see bench/k8s_real_restart.py)")
    return parser.parse_args()


def main() -> None:
    args = arguments()
    if args.real_nodes:
        from bench.k8s_real_restart import run

        run(args.real_nodes, args.trials)
        return
    nodes_needed = args.pods // 4 + 2
    with tempfile.TemporaryDirectory() as folder, TestCluster(find_binaries()) as cluster:
        root = Path(folder)
        nodes = cluster.create_nodes(nodes_needed, prefix="bench-", gpus=8, labels={"bench": "k8s"})
        config.load_kube_config(config_file=str(cluster.kubeconfig))
        api = client.ApiClient()
        core, batch = client.CoreV1Api(api), client.BatchV1Api(api)
        namespace = cluster.create_namespace("bench")
        batch.create_namespaced_job(namespace, job_body("train", namespace, args.pods))
        wait(lambda: len(current(core, namespace)) == args.pods)
        # baseline: restart by hand (suspend, pods gone, resume, all Running)
        baseline = []
        for _ in range(args.trials):
            old = {p.metadata.uid for p in current(core, namespace)}
            began = time.monotonic()
            batch.patch_namespaced_job("train", namespace, {"spec": {"suspend": True}})
            wait(lambda: not current(core, namespace))
            batch.patch_namespaced_job("train", namespace, {"spec": {"suspend": False}})
            baseline.append(wait(partial(running, core, namespace, args.pods, old)) - began)
        processes = [subprocess.Popen([sys.executable, "-m", "kcover", "operator", "--kubeconfig",
                                       str(cluster.kubeconfig), "--namespace", namespace],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
        for node in nodes:
            processes.append(subprocess.Popen(
                [sys.executable, "-m", "kcover", "agent", "--node", node, "--log-root", str(cluster.log_root),
                 "--kmsg", "", "--state-dir", str(root), "--kubeconfig", str(cluster.kubeconfig),
                 "--health-interval", "0"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        time.sleep(20)  # let every agent and the operator start and list (18 processes on 2 cores)
        rows = []
        try:
            for trial in range(args.trials):
                pods = current(core, namespace)
                old = {p.metadata.uid for p in pods}
                victim = pods[trial % len(pods)]
                began = time.monotonic()
                cluster.write_container_log(namespace, victim.metadata.name, "trainer", [XID])
                agent_at = wait(partial(recorded, core, namespace, victim.metadata.name))
                claim_at = wait(partial(claimed, batch, namespace, trial + 2))
                gone_at = wait(partial(gone, core, namespace, old))
                done_at = wait(partial(running, core, namespace, args.pods, old))
                rows.append((agent_at - began, claim_at - agent_at, gone_at - claim_at, done_at - gone_at,
                             done_at - began))
                for node in core.list_node().items:  # give the quarantined node back for the next trial
                    if node.spec.unschedulable and node.metadata.name in nodes:
                        core.patch_node(node.metadata.name, {"spec": {"unschedulable": None, "taints": None},
                                                             "metadata": {"annotations": {
                                                                 "kcover.io/quarantined": None,
                                                                 "kcover.io/quarantined-at": None}}})
                time.sleep(2)
        finally:
            for process in processes:
                process.terminate()
            for process in processes:
                process.wait(timeout=20)
    median = statistics.median(r[4] for r in rows)
    print(f"{args.pods}-pod job on {nodes_needed} KWOK nodes, {len(nodes)} agents, {args.trials} trials")
    print("trial  agent  operator  old pods gone  new pods Running  total (s)")
    for index, row in enumerate(rows):
        print(f"{index:5d}  {row[0]:5.2f}  {row[1]:8.2f}  {row[2]:13.2f}  {row[3]:16.2f}  {row[4]:9.2f}")
    floor = statistics.median(baseline)
    print(f"median total {median:.2f} s (target <= 10 s); restart by hand, same cluster: {floor:.2f} s;"
          f" ratio {median / floor:.2f}")


if __name__ == "__main__":
    main()
