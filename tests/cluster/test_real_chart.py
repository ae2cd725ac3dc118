"""The Helm chart, for real: the agent and the operator as pods on real nodes, from the kcover image.

The image is the one ``python -m kcover.testing.kcover_image`` builds from this
checkout the way the Dockerfile does (``make test`` builds it); it is imported
into each node's containerd and ``helm install charts/kcover`` runs it. The
agent pod must read a real container's log under the node's ``/var/log/pods``
(files the kubelet writes as root, mode 0640) and open the node's kernel log
(``/dev/kmsg``, which a container's device cgroup refuses unless privileged):
the chart's security context is the least that does both.
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kcover.ports import free_port
from kcover.testing import TestCluster, kcover_image
from kcover.testing._rest import ApiError
from kcover.testing.fixtures import ALLOW_SKIP
from kcover.testing.realjobs import OPT_IN, pod_log
from kcover.testing.realnodes import POOL_LABEL, REAL_NODE_LABEL, RealNodePool, host_runtime_pod

pytestmark = pytest.mark.real_node

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "kcover"
XID = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus."


@pytest.fixture(scope="module")
def image() -> kcover_image.KcoverImage:
    found = kcover_image.find()
    if found is None:
        message = "the kcover image of this checkout is not built: python -m kcover.testing.kcover_image"
        if os.environ.get(ALLOW_SKIP) == "1":
            pytest.skip(message)
        pytest.fail(message + " (make test builds it)", pytrace=False)
    return found


def chart_values(pool: RealNodePool, image: kcover_image.KcoverImage, api_port: str) -> dict[str, Any]:
    on_pool = {POOL_LABEL: pool.pool_id}
    return {
        "image": {"repository": image.repository, "tag": image.tag, "pullPolicy": "Never"},
        # the real nodes have no service proxy and no pod network: host networking, and the API server's
        # own address for the in-cluster configuration
        "extraEnv": [{"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
                     {"name": "KUBERNETES_SERVICE_PORT", "value": api_port}],
        "operator": {"replicas": 1, "hostNetwork": True, "nodeSelector": on_pool, "metricsPort": free_port(),
                     "tolerations": [{"key": REAL_NODE_LABEL, "operator": "Exists"}]},
        "agent": {"hostNetwork": True, "nodeSelector": on_pool, "healthInterval": 0, "snapshotDir": ""},
        # the breaker counts every node of the shared test cluster: let it quarantine one of a handful
        "policy": {"quarantineMaxShare": 1.0},
    }


@pytest.fixture
def own_cluster(test_cluster: TestCluster) -> Iterator[TestCluster]:
    """A cluster of this test's own: the chart's operator acts cluster-wide, and its quarantine breaker
    counts every node, so jobs and quarantines other tests left in the shared cluster must not reach it."""
    with TestCluster(test_cluster.binaries) as cluster:
        yield cluster


def test_helm_install_runs_the_agent_and_operator_pods_that_read_real_logs_and_restart_a_job(
        own_cluster: TestCluster, image: kcover_image.KcoverImage, tmp_path: Path) -> None:
    test_cluster = own_cluster
    test_namespace = test_cluster.create_namespace("trainers")
    pool = RealNodePool(test_cluster, test_cluster.binaries.path("kubelet"))
    release = f"kc-{uuid.uuid4().hex[:6]}"
    try:
        nodes = pool.add(2, prefix="chart-")
        for node in pool.nodes.values():
            node.ctr("images", "import", str(image.archive), timeout=300)
        values = tmp_path / "values.yaml"
        values.write_text(yaml.safe_dump(chart_values(pool, image, test_cluster.server.rsplit(":", 1)[1])))
        done = test_cluster.run_tool("helm", "install", "kcover", str(CHART), "-n", release, "--create-namespace",
                                     "-f", str(values), timeout=120)
        assert done.returncode == 0, done.stderr

        def kcover_pods() -> list[dict[str, Any]]:
            return list(test_cluster.api.get(
                f"/api/v1/namespaces/{release}/pods?labelSelector=app.kubernetes.io/name=kcover")["items"])

        def running(component: str, count: int) -> list[dict[str, Any]] | None:
            found = [p for p in kcover_pods() if p["metadata"]["labels"].get("app.kubernetes.io/component")
                     == component and p["status"].get("phase") == "Running"]
            return found if len(found) == count else None

        agents = test_cluster.wait_for(lambda: running("agent", 2), 180,
                                       "an agent pod Running on each real node")
        test_cluster.wait_for(lambda: running("operator", 1), 120, "the operator pod Running")
        assert sorted(p["spec"]["nodeName"] for p in agents) == sorted(nodes)
        for agent in agents:  # the node's kernel log opened as a device, from inside the pod
            test_cluster.wait_for(lambda a=agent: "kernel log /dev/kmsg: the device, new messages"
                                  in pod_log(pool, a), 60, "the agent pod's start-up lines")

        code = f"print('step 3 loss 1.0', flush=True); print({XID!r}, flush=True); import time; time.sleep(600)"
        spec = host_runtime_pod("trainer", [sys.executable, "-c", code], node=nodes[0], project_root=ROOT)
        job = {"apiVersion": "batch/v1", "kind": "Job",
               "metadata": {"name": "xid", "namespace": test_namespace, "labels": dict(OPT_IN)},
               "spec": {"completions": 1, "parallelism": 1, "completionMode": "Indexed", "backoffLimit": 10,
                        "template": {"spec": spec}}}
        test_cluster.api.post(f"/apis/batch/v1/namespaces/{test_namespace}/jobs", job)

        def restarted() -> dict[str, Any] | None:
            try:
                body = test_cluster.api.get(f"/apis/batch/v1/namespaces/{test_namespace}/jobs/xid")
            except ApiError:  # replaced meanwhile: look again
                return None
            record = json.loads((body["metadata"].get("annotations") or {}).get("kcover.io/recovery", "{}"))
            return record if record.get("restarts", 0) >= 1 else None

        try:
            record = test_cluster.wait_for(restarted, 120, "the operator pod's restart of the job")
        except TimeoutError as err:
            shown = "\n".join(f"--- {p['metadata']['name']}\n{pod_log(pool, p)[-3000:]}" for p in kcover_pods())
            raise AssertionError(f"{err}; the kcover pods' logs:\n{shown}") from None
        assert record["last"]["category"] == "gpu_hardware"  # read by the agent pod from the real log file
        assert record["last"]["nodes"] == [nodes[0]]
        # the claim (restarts 1) comes first, the quarantine right after it
        test_cluster.wait_for(lambda: test_cluster.api.get(f"/api/v1/nodes/{nodes[0]}")["spec"]
                              .get("unschedulable") is True, 60, f"{nodes[0]} quarantined")
        done = test_cluster.run_tool("helm", "uninstall", "kcover", "-n", release, "--wait", timeout=120)
        assert done.returncode == 0, done.stderr
        test_cluster.wait_for(lambda: not kcover_pods(), 60, "the kcover pods gone after helm uninstall")
    finally:
        test_cluster.api.request("DELETE", f"/api/v1/namespaces/{release}")
        left = pool.stop()
    assert left == []
