"""Operator and agent at scale: 250 nodes, 2,000 pods of opted-in jobs, one fault per second.

On the real test control plane (KWOK nodes), 125 Indexed Jobs × 16 pods run on
250 fake 8-GPU nodes.  Once a second a fatal fault record is written onto a
random job's pod, exactly as the node agent writes it; the operator's reaction
is the time until the restart is claimed on that job.  Reported: p50/p99
reaction (target p99 ≤ 2 s) and the operator's peak RSS (target ≤ 300 MB).
Then one agent follows the logs of 16 pods on its node while they grow by
10,000 lines/s in all: its peak RSS (target ≤ 80 MB) and CPU.  The baseline
for the reaction, measured in the same run, is a bare API round trip (one
patch and one read of the job), the floor any controller pays.

    python -m bench.k8s_operator_scale [--nodes 250] [--jobs 125] [--faults 30]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
from kubernetes import client, config

from kcover.testing import TestCluster, find_binaries

RECORD = {"rule": "xid.79.fallen-off-bus", "category": "gpu_hardware", "severity": "fatal", "role": "root",
          "retriable": True, "node_at_fault": True, "priority": 90, "title": "GPU has fallen off the bus (Xid 79)",
          "count": 1, "line": "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.",
          "source": "bench", "line_number": 1, "timestamp": None, "rank": 0, "node": None}
BENIGN = "[2024-05-01 10:00:00,123] [INFO] iteration {i}/250000 | lm loss: 2.114E+00 | grad norm: 0.412"


def job(name: str, namespace: str, pods: int) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "namespace": namespace, "labels": {"kcover.io/cascading-recovery": "true"},
                         "annotations": {"kcover.io/max-restarts": "1000", "kcover.io/exclude-nodes": "false"}},
            "spec": {"completions": pods, "parallelism": pods, "completionMode": "Indexed", "backoffLimit": 10000,
                     "podFailurePolicy": {"rules": [{"action": "Ignore",
                                                     "onExitCodes": {"operator": "NotIn", "values": [0]}}]},
                     "template": {"spec": {"restartPolicy": "Never", "nodeSelector": {"bench": "scale"},
                                           "containers": [{"name": "trainer", "image": "trainer:v1",
                                                           "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}}


def attempt(batch: client.BatchV1Api, namespace: str, name: str) -> int:
    annotations = batch.read_namespaced_job(name, namespace).metadata.annotations or {}
    return int(json.loads(annotations.get("kcover.io/recovery", "{}")).get("attempt", 1))


def running_pods(core: client.CoreV1Api, namespace: str) -> list[Any]:
    return [p for p in core.list_namespaced_pod(namespace).items
            if p.status.phase == "Running" and not p.metadata.deletion_timestamp]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=250)
    parser.add_argument("--jobs", type=int, default=125)
    parser.add_argument("--pods-per-job", type=int, default=16)
    parser.add_argument("--faults", type=int, default=30)
    parser.add_argument("--agent-seconds", type=float, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder, TestCluster(find_binaries()) as cluster:
        root = Path(folder)
        cluster.create_nodes(args.nodes, prefix="scale-", gpus=8, labels={"bench": "scale"}, wait=False)
        config.load_kube_config(config_file=str(cluster.kubeconfig))
        api = client.ApiClient()
        core, batch = client.CoreV1Api(api), client.BatchV1Api(api)
        namespace = cluster.create_namespace("scale")
        start_jobs(core, batch, namespace, args.jobs, args.pods_per_job, args.nodes)
        floor = api_floor(batch, namespace)
        reactions, peak = operator_under_faults(cluster, core, batch, namespace, args.jobs, args.faults)
        agent_rss, agent_cpu = agent_load(cluster, core, namespace, root, args.agent_seconds)
    reactions.sort()
    p99 = reactions[min(len(reactions) - 1, int(0.99 * len(reactions)))]
    print(f"operator reaction over {len(reactions)} faults: p50 {statistics.median(reactions):.2f} s, "
          f"p99 {p99:.2f} s (target <= 2 s)")
    print(f"API round-trip floor (patch + read a job): p50 {statistics.median(floor) * 1000:.0f} ms")
    print(f"operator peak RSS {peak / 2**20:.0f} MB (target <= 300 MB)")
    print(f"agent at 10,000 lines/s: peak RSS {agent_rss / 2**20:.0f} MB (target <= 80 MB), "
          f"CPU {agent_cpu:.0%} of a core")


def start_jobs(core: client.CoreV1Api, batch: client.BatchV1Api, namespace: str, jobs: int, per_job: int,
               nodes: int) -> None:
    began = time.monotonic()
    for index in range(jobs):
        batch.create_namespaced_job(namespace, job(f"job-{index}", namespace, per_job))
    while len(running_pods(core, namespace)) < jobs * per_job:
        if time.monotonic() - began > 900:
            raise TimeoutError("pods did not all start")
        time.sleep(2)
    print(f"{jobs * per_job} pods Running on {nodes} nodes after {time.monotonic() - began:.0f} s")


def api_floor(batch: client.BatchV1Api, namespace: str) -> list[float]:
    """One patch and one read of a job: the least any controller pays to act."""
    floor = []
    for _ in range(20):
        start = time.monotonic()
        batch.patch_namespaced_job("job-0", namespace, {"metadata": {"annotations": {"bench": str(start)}}})
        batch.read_namespaced_job("job-0", namespace)
        floor.append(time.monotonic() - start)
    return floor


def operator_under_faults(cluster: TestCluster, core: client.CoreV1Api, batch: client.BatchV1Api, namespace: str,
                          jobs: int, faults: int) -> tuple[list[float], int]:
    """Seconds from a fault record on a pod to the restart claimed, per fault; and the operator's peak RSS."""
    operator = subprocess.Popen([sys.executable, "-m", "kcover", "operator", "--kubeconfig",
                                 str(cluster.kubeconfig), "--namespace", namespace],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    watcher = psutil.Process(operator.pid)
    time.sleep(15)  # initial listing of every pod
    rng = random.Random(1)
    reactions: list[float] = []
    peak = watcher.memory_info().rss
    try:
        for _ in range(faults):
            tick = time.monotonic()
            name = f"job-{rng.randrange(jobs)}"
            before = attempt(batch, namespace, name)
            pods = [p for p in running_pods(core, namespace)
                    if p.metadata.labels.get("batch.kubernetes.io/job-name") == name]
            if not pods:
                continue
            record = dict(RECORD, node=pods[0].spec.node_name)
            start = time.monotonic()
            core.patch_namespaced_pod(pods[0].metadata.name, namespace,
                                      {"metadata": {"annotations": {"kcover.io/faults": json.dumps([record])}}})
            while attempt(batch, namespace, name) <= before and time.monotonic() - start < 30:
                time.sleep(0.02)
            reactions.append(time.monotonic() - start)
            peak = max(peak, watcher.memory_info().rss)
            time.sleep(max(0.0, tick + 1.0 - time.monotonic()))
    finally:
        operator.terminate()
        operator.wait(timeout=30)
    return reactions, peak


def agent_load(cluster: TestCluster, core: client.CoreV1Api, namespace: str, root: Path,
               seconds: float) -> tuple[int, float]:
    """One agent following 16 pods' logs growing by 10,000 lines/s in all: its peak RSS and CPU share."""
    pods = running_pods(core, namespace)
    node = pods[0].spec.node_name
    mine = [p for p in pods if p.spec.node_name == node] or pods[:1]
    agent = subprocess.Popen([sys.executable, "-m", "kcover", "agent", "--node", node, "--log-root",
                              str(cluster.log_root), "--kmsg", "", "--state-dir", str(root),
                              "--kubeconfig", str(cluster.kubeconfig), "--health-interval", "0"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    watcher = psutil.Process(agent.pid)
    time.sleep(5)
    cpu_before = watcher.cpu_times()
    peak = 0
    began = time.monotonic()
    written = 0
    while time.monotonic() - began < seconds:
        for pod in mine:
            lines = [BENIGN.format(i=written + k) for k in range(10_000 // 10 // len(mine))]
            cluster.write_container_log(namespace, pod.metadata.name, "trainer", lines)
            written += len(lines)
        peak = max(peak, watcher.memory_info().rss)
        time.sleep(max(0.0, began + written / 10_000 - time.monotonic()))
    cpu_after = watcher.cpu_times()
    wall = time.monotonic() - began
    agent.terminate()
    agent.wait(timeout=30)
    used = (cpu_after.user + cpu_after.system) - (cpu_before.user + cpu_before.system)
    return peak, used / wall


if __name__ == "__main__":
    main()
