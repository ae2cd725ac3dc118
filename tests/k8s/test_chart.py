"""The Helm chart, rendered by the real helm, and its RBAC proven by the real authorizer.

The operator and the agents run with service-account tokens bound to exactly
the chart's roles and carry out the whole Xid scenario; tokens without them
are denied, and the agent's role cannot do what only the operator may.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes
import pytest
import yaml
from kubernetes import client
from tests.k8s.conftest import Processes
from tests.k8s.test_recovery_e2e import xid_scenario

from kcover.health.quarantine.kube import KubeQuarantine
from kcover.k8s.names import GENERATION, RANK
from kcover.k8s.operator.actuate import Actuator
from kcover.k8s.operator.views import pod_view
from kcover.testing import TestCluster

CHART = Path(__file__).resolve().parents[2] / "charts" / "kcover"


def render(cluster: TestCluster, namespace: str) -> list[dict[str, Any]]:
    done = cluster.run_tool("helm", "template", "kcover", str(CHART), "--namespace", namespace)
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def test_chart_renders_every_part(test_cluster: TestCluster) -> None:
    kinds = {(d["kind"], d["metadata"]["name"]) for d in render(test_cluster, "kcover-system")}
    assert {("Deployment", "kcover-operator"), ("DaemonSet", "kcover-agent"), ("Service", "kcover-operator-metrics"),
            ("ClusterRole", "kcover-operator"), ("ClusterRole", "kcover-agent"), ("Role", "kcover-operator-leases"),
            ("RecoveryPolicy", "default"), ("ConfigMap", "kcover-dashboard")} <= kinds
    lint = test_cluster.run_tool("helm", "lint", str(CHART))
    assert lint.returncode == 0, lint.stdout + lint.stderr


def test_operator_and_agent_work_with_exactly_the_charts_roles(
        test_cluster: TestCluster, k8s_api: Any, test_namespace: str, gpu_nodes: list[str],
        kcover_processes: Processes, tmp_path: Path) -> None:
    test_cluster.install_crds([CHART / "crds" / "recoverypolicies.kcover.io.yaml"])
    custom = client.CustomObjectsApi(k8s_api)
    rbac = client.RbacAuthorizationV1Api(k8s_api)
    for doc in render(test_cluster, test_namespace):
        if doc["kind"] == "ClusterRole":
            rbac.replace_cluster_role(doc["metadata"]["name"], doc) if _exists(rbac, doc) else \
                rbac.create_cluster_role(doc)
        elif doc["kind"] == "Role":
            rbac.create_namespaced_role(test_namespace, doc)
        elif doc["kind"] == "RecoveryPolicy":
            custom.create_namespaced_custom_object("kcover.io", "v1alpha1", test_namespace, "recoverypolicies", doc)
    operator = test_cluster.service_account(test_namespace, "kcover-operator", cluster_roles=["kcover-operator"],
                                            roles=["kcover-operator-leases"])
    agent = test_cluster.service_account(test_namespace, "kcover-agent", cluster_roles=["kcover-agent"])
    xid_scenario(test_cluster, k8s_api, test_namespace, gpu_nodes, kcover_processes, tmp_path,
                 operator_config=operator.kubeconfig, agent_config=agent.kubeconfig, crash=True)
    agent_api = kubernetes.config.new_client_from_config(config_file=str(agent.kubeconfig))
    core = client.CoreV1Api(k8s_api)
    some_pod = core.list_namespaced_pod(test_namespace).items[0].metadata.name
    # an in-place restart's generation and a standby's rank are pod patches the operator's role must allow
    operator_api = kubernetes.config.new_client_from_config(config_file=str(operator.kubeconfig))
    target = core.create_namespaced_pod(test_namespace, {"metadata": {"name": "ordered"}, "spec": {
        "containers": [{"name": "c", "image": "trainer"}], "nodeSelector": {"none": "none"}}})
    view = pod_view(k8s_api.sanitize_for_serialization(target))
    Actuator(operator_api, KubeQuarantine(client.CoreV1Api(operator_api))).order_generation([view], 7, {view.uid: 1})
    ordered = core.read_namespaced_pod("ordered", test_namespace).metadata
    assert (ordered.annotations[GENERATION], ordered.annotations[RANK], ordered.labels[RANK]) == ("7", "1", "1")
    with pytest.raises(client.exceptions.ApiException) as denied:
        client.CoreV1Api(agent_api).delete_namespaced_pod(some_pod, test_namespace)
    assert denied.value.status == 403
    nobody = test_cluster.service_account(test_namespace, "nobody")
    nobody_api = kubernetes.config.new_client_from_config(config_file=str(nobody.kubeconfig))
    with pytest.raises(client.exceptions.ApiException) as refused:
        client.CoreV1Api(nobody_api).list_pod_for_all_namespaces()
    assert refused.value.status == 403


def test_schema_refuses_an_invalid_policy(test_cluster: TestCluster, k8s_api: Any, test_namespace: str) -> None:
    test_cluster.install_crds([CHART / "crds" / "recoverypolicies.kcover.io.yaml"])
    bad = {"apiVersion": "kcover.io/v1alpha1", "kind": "RecoveryPolicy", "metadata": {"name": "default"},
           "spec": {"maxRestarts": -1, "colour": "red"}}
    with pytest.raises(client.exceptions.ApiException) as refused:
        client.CustomObjectsApi(k8s_api).create_namespaced_custom_object(
            "kcover.io", "v1alpha1", test_namespace, "recoverypolicies", bad)
    assert refused.value.status == 422
    assert "maxRestarts" in refused.value.body


def _exists(rbac: client.RbacAuthorizationV1Api, doc: dict[str, Any]) -> bool:
    try:
        rbac.read_cluster_role(doc["metadata"]["name"])
    except client.exceptions.ApiException:
        return False
    return True


def test_the_agent_daemonset_reads_nvml_and_frees_the_snapshot_folder(test_cluster: TestCluster, k8s_api: Any,
                                                                 test_namespace: str) -> None:
    (daemonset,) = [d for d in render(test_cluster, test_namespace) if d["kind"] == "DaemonSet"]
    pod = daemonset["spec"]["template"]["spec"]
    args = pod["containers"][0]["args"]
    folder = args[args.index("--snapshot-dir") + 1]
    assert folder == "/dev/shm/kcover" and args[args.index("--snapshot-max-age") + 1] == "86400"
    assert {"name": "snapshots", "mountPath": folder} in pod["containers"][0]["volumeMounts"]
    assert {"name": "snapshots", "hostPath": {"path": folder, "type": "DirectoryOrCreate"}} in pod["volumes"]
    env = {item["name"]: item.get("value") for item in pod["containers"][0]["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all" and env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"  # NVML, no GPU
    assert "runtimeClassName" not in pod
    client.AppsV1Api(k8s_api).create_namespaced_daemon_set(test_namespace, daemonset, dry_run="All")
