"""Training Jobs on real nodes, for tests and benchmarks: build them, read their pods' logs.

A job here runs :mod:`kcover.testing.trainer` (gloo DDP, ``kcover.checkpoint``) in
host-runtime pods (:func:`kcover.testing.realnodes.host_runtime_pod`), one pod
per node (required anti-affinity), with the checkpoint folder a hostPath every
node mounts — shared storage. The pods' output is read where the kubelet wrote
it, under the node's ``podLogsDir``, so what a test sees is what the agent sees.
"""

from __future__ import annotations

import os
import re
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kcover.ports import free_port
from kcover.testing import node_cleanup
from kcover.testing._core import ClusterCore
from kcover.testing.realnodes import POOL_LABEL, RealNodePool, host_runtime_pod

__all__ = [
    "RESUMED",
    "TRAINER",
    "kill_trainers_on",
    "last_step",
    "pod_log",
    "pods_of",
    "trainer_job",
]

TRAINER = "kcover.testing.trainer"
OPT_IN = {"kcover.io/cascading-recovery": "true"}
_STEP = re.compile(r" stdout F step (\d+) loss")
RESUMED = re.compile(r" stdout F resumed from step (\d+) \((\w+)\)")


def trainer_job(
    name: str,
    namespace: str,
    pool: RealNodePool,
    pods: int,
    *,
    checkpoints: Path,
    env: Mapping[str, str] | None = None,
    prefer: list[str] | None = None,
    grace: int = 10,
    opted_in: bool = False,
    project_root: Path,
) -> dict[str, Any]:
    """An Indexed Job of ``pods`` trainer ranks on ``pool``'s nodes (``prefer``: first choice).

    Opted in, it also gets what the README asks of opted-in jobs: a large
    ``backoffLimit`` and a pod failure policy that leaves retries to kcover.
    """
    env = {
        "WORLD_SIZE": str(pods),
        "PYTHONUNBUFFERED": "1",
        "KCOVER_CHECKPOINT_DIR": "/ckpt",
        "MASTER_ADDR": "127.0.0.1",  # host networking on one machine: every rank reaches rank 0 here
        "MASTER_PORT": str(free_port()),
        "GLOO_SOCKET_IFNAME": "lo",
        **(env or {}),
    }
    spec = host_runtime_pod(
        "trainer", [sys.executable, "-m", TRAINER], project_root=project_root,
        grace_seconds=grace, env=env, writable={"/ckpt": checkpoints},
    )
    spec["nodeSelector"][POOL_LABEL] = pool.pool_id
    spec["affinity"] = {
        "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
            "labelSelector": {"matchLabels": {"batch.kubernetes.io/job-name": name}},
            "topologyKey": "kubernetes.io/hostname",
        }]},
    }
    if prefer:
        spec["affinity"]["nodeAffinity"] = {"preferredDuringSchedulingIgnoredDuringExecution": [{
            "weight": 100,
            "preference": {"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": list(prefer)}]},
        }]}
    job_spec: dict[str, Any] = {
        "completions": pods, "parallelism": pods, "completionMode": "Indexed", "backoffLimit": 5,
        "template": {"spec": spec},
    }
    if opted_in:
        job_spec["backoffLimit"] = 1000
        job_spec["podFailurePolicy"] = {"rules": [
            {"action": "Ignore", "onExitCodes": {"operator": "NotIn", "values": [0]}}]}
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(OPT_IN) if opted_in else {}},
        "spec": job_spec,
    }


def pods_of(cluster: ClusterCore, namespace: str, job: str) -> list[dict[str, Any]]:
    path = f"/api/v1/namespaces/{namespace}/pods?labelSelector=batch.kubernetes.io/job-name={job}"
    return list(cluster.api.get(path)["items"])


def pod_log(pool: RealNodePool, pod: dict[str, Any]) -> str:
    """Every container log line the kubelet wrote for ``pod`` (CRI format), '' if none yet."""
    node = pool.nodes.get(pod["spec"].get("nodeName", ""))
    if node is None:
        return ""
    meta = pod["metadata"]
    folder = node.pod_logs / f"{meta['namespace']}_{meta['name']}_{meta['uid']}"
    return "".join(p.read_text(errors="replace") for p in sorted(folder.glob("*/*.log")))


def last_step(text: str) -> int:
    """The highest ``step N`` a trainer printed in ``text`` (0 if none)."""
    steps = [int(m) for m in _STEP.findall(text)]
    return max(steps) if steps else 0


def kill_trainers_on(pool: RealNodePool, node: str) -> list[int]:
    """SIGKILL the trainer processes in ``node``'s containers (found through the node's cgroups)."""
    killed = []
    for pid in node_cleanup.cgroup_pids(pool.nodes[node].cgroup_root):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
            if TRAINER in cmdline:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
        except (FileNotFoundError, ProcessLookupError):
            continue
    return killed
