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
import socket
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
    in_place: bool = False,
    node_memory: Path | None = None,
    standby: int = 0,
    project_root: Path,
) -> dict[str, Any]:
    """An Indexed Job of ``pods`` trainer ranks on ``pool``'s nodes (``prefer``: first choice).

    Opted in, it also gets what the README asks of opted-in jobs: a large
    ``backoffLimit`` and a pod failure policy that leaves retries to kcover.
    ``in_place``: the trainer runs under ``kcover pod``, with the pod's
    ``kcover.io/generation`` (and ``kcover.io/inject``) mounted as the README
    shows, so it restarts in place (and takes ``kcover inject``'s orders).
    ``node_memory``: each node's shared memory is a folder of its own,
    ``<node_memory>/<node name>`` (``KCOVER_SHARED_MEMORY``), as ``/dev/shm`` is
    on separate machines: a pod moved to another node does not find its snapshot.
    ``standby``: that many more pods, warm standbys (``kcover.io/standby``; implies ``in_place``): every pod
    runs ``kcover pod --assigned-rank`` with its ``kcover.io/rank`` mounted beside the generation.
    """
    in_place = in_place or standby > 0
    env = {
        "WORLD_SIZE": str(pods),
        "PYTHONUNBUFFERED": "1",
        "KCOVER_CHECKPOINT_DIR": "/ckpt",
        "MASTER_ADDR": "127.0.0.1",  # host networking on one machine: every rank reaches rank 0 here
        "MASTER_PORT": str(free_port_pair()),
        "GLOO_SOCKET_IFNAME": "lo",
        **(env or {}),
    }
    trainer = [sys.executable, "-m", TRAINER]
    command = [sys.executable, "-m", "kcover", "pod", "--grace-period", str(max(1, grace - 2)),
               *(["--assigned-rank"] if standby else []), "--", *trainer]
    writable = {"/ckpt": checkpoints, **({"/node-memory": node_memory} if node_memory else {})}
    spec = host_runtime_pod(
        "trainer", command if in_place else trainer, project_root=project_root,
        grace_seconds=grace, env=env, writable=writable,
    )
    if node_memory:  # $(NODE_NAME) is expanded by the kubelet from the variable defined before it
        spec["containers"][0]["env"][:0] = [
            {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {"name": "KCOVER_SHARED_MEMORY", "value": "/node-memory/$(NODE_NAME)"}]
    if in_place:
        spec["containers"][0]["volumeMounts"].append({"name": "kcover-generation", "mountPath": "/etc/kcover"})
        spec["volumes"].append({"name": "kcover-generation", "downwardAPI": {"items": [
            {"path": "generation", "fieldRef": {"fieldPath": "metadata.annotations['kcover.io/generation']"}},
            {"path": "inject", "fieldRef": {"fieldPath": "metadata.annotations['kcover.io/inject']"}},
            *([{"path": "rank", "fieldRef": {"fieldPath": "metadata.annotations['kcover.io/rank']"}}]
              if standby else [])]}})
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
        "completions": pods + standby, "parallelism": pods + standby, "completionMode": "Indexed", "backoffLimit": 5,
        "template": {"spec": spec},
    }
    if opted_in:
        job_spec["backoffLimit"] = 1000
        job_spec["podFailurePolicy"] = {"rules": [
            {"action": "Ignore", "onExitCodes": {"operator": "NotIn", "values": [0]}}]}
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(OPT_IN) if opted_in else {},
                     "annotations": {"kcover.io/standby": str(standby)} if standby else {}},
        "spec": job_spec,
    }


def free_port_pair() -> int:
    """A free port whose next one is free too (``kcover pod`` uses both, one per generation in turn)."""
    for _ in range(50):
        port = free_port()
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise RuntimeError("no two consecutive free ports found")


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
    """SIGKILL the trainer processes in ``node``'s containers (found through the node's cgroups): started as
    ``python -m kcover.testing.trainer``, or warm workers of ``kcover pod`` that became one (named ``trainer``).
    ``kcover pod`` itself and its waiting warm workers are left alone."""
    killed = []
    for pid in node_cleanup.cgroup_pids(pool.nodes[node].cgroup_root):
        try:
            arguments = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
            warm = any(a.endswith("zygote.py") for a in arguments[1:2])
            if arguments[1:3] == ["-m", TRAINER] or (warm and Path(f"/proc/{pid}/comm").read_text().strip()
                                                      == TRAINER.rsplit(".", 1)[-1]):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
        except (FileNotFoundError, ProcessLookupError):
            continue
    return killed
