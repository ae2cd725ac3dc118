"""Real nodes: a pod on a kubelet node runs a real command, and nothing stays behind.

These run containers for real (containerd + runc + kubelet per node on this
machine, see :mod:`kcover.testing.realnodes`): the exit code, the log file under
the node's ``podLogsDir`` and the agent's reading of it are all produced by the
real programs, none written by the test.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from kcover.k8s.names import OPT_IN_LABEL, OPT_IN_VALUE, POD_FAULTS
from kcover.testing import TestCluster
from kcover.testing.node_cleanup import HostChanges, leftovers, read_sysctls, record_dir, undo_stale
from kcover.testing.realnodes import RealNodePool, host_runtime_pod

pytestmark = pytest.mark.real_node

ROOT = Path(__file__).resolve().parents[2]
PYTHON = str(Path(sys.executable))
XID = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus."


def run_pod(cluster: TestCluster, namespace: str, node: str, code: str, name: str | None = None,
            env: dict[str, str] | None = None) -> dict[str, Any]:
    name = name or f"p-{uuid.uuid4().hex[:6]}"
    spec = host_runtime_pod(name, [PYTHON, "-c", code], node=node, project_root=ROOT, env=env)
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace}, "spec": spec}
    return cluster.api.post(f"/api/v1/namespaces/{namespace}/pods", body)


def wait_terminated(cluster: TestCluster, namespace: str, name: str, timeout: float = 90) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        pod = cluster.pod(namespace, name)
        for status in pod.get("status", {}).get("containerStatuses") or []:
            if "terminated" in (status.get("state") or {}):
                return pod
        return None

    return cluster.wait_for(done, timeout, f"pod {namespace}/{name} to finish")


def container_log(pool: RealNodePool, node: str, namespace: str, pod: dict[str, Any]) -> str:
    folder = pool.nodes[node].pod_logs / f"{namespace}_{pod['metadata']['name']}_{pod['metadata']['uid']}"
    return (folder / "main" / "0.log").read_text()


def test_a_pod_runs_a_real_command_and_its_log_lands_in_the_nodes_folder(
        test_cluster: TestCluster, real_nodes: RealNodePool, test_namespace: str) -> None:
    node = sorted(real_nodes.nodes)[0]
    code = ("import os, sys, torch, kcover; print('torch', torch.__version__, 'pid', os.getpid(), flush=True); "
            "print('to stderr', file=sys.stderr, flush=True); sys.exit(3)")
    created = run_pod(test_cluster, test_namespace, node, code)
    pod = wait_terminated(test_cluster, test_namespace, created["metadata"]["name"])
    state = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert state["exitCode"] == 3
    assert pod["spec"]["nodeName"] == node
    assert pod["status"]["podIP"] == real_nodes.nodes[node].ip
    text = container_log(real_nodes, node, test_namespace, pod)
    lines = text.splitlines()
    assert any(" stdout F torch " in line for line in lines), text
    assert any(line.endswith(" stderr F to stderr") for line in lines), text
    pid = next(int(line.split()[-1]) for line in lines if " stdout F torch " in line)
    assert pid != os.getpid()  # printed by the container's own process (its own pid namespace)


def test_the_agent_reads_a_real_containers_log(
        test_cluster: TestCluster, real_nodes: RealNodePool, test_namespace: str, tmp_path: Path) -> None:
    """An opted-in Job's pod prints an Xid on a real node; the agent there finds it in the kubelet's file."""
    node = sorted(real_nodes.nodes)[1]
    code = f"print('step 7 loss 2.0', flush=True); print({XID!r}, flush=True); import time; time.sleep(600)"
    spec = host_runtime_pod("trainer", [PYTHON, "-c", code], node=node, project_root=ROOT)
    job = {"apiVersion": "batch/v1", "kind": "Job",
           "metadata": {"name": "xid", "namespace": test_namespace, "labels": {OPT_IN_LABEL: OPT_IN_VALUE}},
           "spec": {"completions": 1, "parallelism": 1, "completionMode": "Indexed", "backoffLimit": 0,
                    "template": {"spec": spec}}}
    test_cluster.api.post(f"/apis/batch/v1/namespaces/{test_namespace}/jobs", job)
    (tmp_path / "kmsg").touch()
    with (tmp_path / "agent.log").open("wb") as log:
        agent = subprocess.Popen(
            [PYTHON, "-m", "kcover", "agent", "--node", node, "--log-root", str(real_nodes.nodes[node].pod_logs),
             "--kmsg", str(tmp_path / "kmsg"), "--state-dir", str(tmp_path / "agent"),
             "--kubeconfig", str(test_cluster.kubeconfig), "--health-interval", "0"],
            stdout=log, stderr=subprocess.STDOUT)
        try:
            def faults() -> list[dict[str, Any]] | None:
                pods = test_cluster.api.get(f"/api/v1/namespaces/{test_namespace}/pods")["items"]
                texts = [(p["metadata"].get("annotations") or {}).get(POD_FAULTS) for p in pods]
                return [r for t in texts if t for r in json.loads(t)] or None

            records = test_cluster.wait_for(faults, 90, "the agent's fault record on the Job's pod")
        finally:
            agent.send_signal(signal.SIGTERM)
            agent.wait(20)
    assert "79" in json.dumps(records) and "gpu" in json.dumps(records).lower(), records
    test_cluster.api.request("DELETE", f"/apis/batch/v1/namespaces/{test_namespace}/jobs/xid",
                             body={"propagationPolicy": "Foreground"})


def test_a_new_pool_runs_a_container_and_leaves_nothing_behind(test_cluster: TestCluster,
                                                               test_namespace: str) -> None:
    before = read_sysctls()
    pool = RealNodePool(test_cluster, test_cluster.binaries.path("kubelet"))
    try:
        [node] = pool.add(1, prefix="clean-")
        created = run_pod(test_cluster, test_namespace, node, "import time; print('up', flush=True); time.sleep(600)")
        test_cluster.wait_for(lambda: test_cluster.pod(test_namespace, created["metadata"]["name"])
                              .get("status", {}).get("phase") == "Running", 60, "the pod Running")
        changes = pool.changes
        assert any(mark for mark in leftovers(changes))  # running: there is something to take away
    finally:
        left = pool.stop()
    assert left == []
    assert leftovers(changes) == []
    assert read_sysctls() == before
    assert not changes.path.exists()


STARTER = """
import sys, time
from pathlib import Path
from kcover.testing import TestCluster
cluster = TestCluster()
cluster.start()
[node] = cluster.add_real_nodes(1)
print(cluster.real_node_pool.changes.path, flush=True)
time.sleep(600)
"""


def test_a_killed_owner_leaves_nothing_once_the_next_pool_starts(tmp_path: Path) -> None:
    """kill -9 of the test process: containerd and kubelet die with it, the next start undoes the rest."""
    with (tmp_path / "err").open("wb") as err:
        owner = subprocess.Popen([PYTHON, "-c", STARTER], stdout=subprocess.PIPE, stderr=err, cwd=ROOT, text=True)
    assert owner.stdout is not None
    with owner.stdout:
        line = owner.stdout.readline().strip()
        assert line, (tmp_path / "err").read_text()[-3000:]
        record = Path(line)
        changes = HostChanges.load(record)
        time.sleep(1)
        owner.kill()
        owner.wait()
    assert leftovers(changes)  # the machine is dirty: cgroups, mounts, the bridge
    assert record.parent == record_dir()
    left = undo_stale()
    assert left == []
    assert leftovers(changes) == []
    assert not record.exists()
