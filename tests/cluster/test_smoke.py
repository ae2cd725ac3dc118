"""Smoke tests proving the test cluster is a real Kubernetes control plane.

Each test exercises one behaviour a fake would not have: the version the
build stamped, CRD schema validation, the Job controller plus KWOK running
pods, a pod failed with a chosen exit code, garbage collection of a deleted
Job's pods, optimistic concurrency (409), RBAC decisions for a user and a
service account, and (when built) the JobSet and training-operator
controllers. They use the official ``kubernetes`` client against the
kubeconfig the harness wrote.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import kubernetes
import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from kcover.testing import ComponentDiedError, TestCluster
from kcover.testing.binaries import hack_dir

pytestmark = pytest.mark.timeout(180)


def _api(cls: Callable[[Any], Any], client: Any) -> Any:
    """A client API object used untyped: these tests pass plain dicts as bodies."""
    return cls(client)


def _status(call: Any) -> int:
    with pytest.raises(ApiException) as info:
        call()
    return int(info.value.status)


def _pods(api: Any, test_namespace: str, selector: str) -> list[Any]:
    return list(
        _api(k8s.CoreV1Api, api).list_namespaced_pod(test_namespace, label_selector=selector).items
    )


def test_server_reports_the_pinned_version(k8s_api: Any) -> None:
    gomod = (hack_dir() / "k8s" / "go.mod").read_text()
    version = _api(k8s.VersionApi, k8s_api).get_code()
    assert version.git_version in gomod
    assert version.major == "1"


def test_nodes_are_kwok_gpu_nodes(test_cluster: TestCluster, k8s_api: Any) -> None:
    nodes = _api(k8s.CoreV1Api, k8s_api).list_node(label_selector="type=kwok").items
    assert len(nodes) >= 2
    for node in nodes:
        assert node.status.allocatable["nvidia.com/gpu"] == "8"
        assert test_cluster.node_ready(node.metadata.name)


def test_crd_schema_rejects_invalid_object(
    test_cluster: TestCluster, k8s_api: Any, test_namespace: str
) -> None:
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.smoke.kcover.test"},
        "spec": {
            "group": "smoke.kcover.test",
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "spec": {
                                    "type": "object",
                                    "required": ["replicas"],
                                    "properties": {"replicas": {"type": "integer", "minimum": 1}},
                                }
                            },
                        }
                    },
                }
            ],
        },
    }
    _api(k8s.ApiextensionsV1Api, k8s_api).create_custom_resource_definition(crd)
    test_cluster.wait_for(lambda: test_cluster._crd_established("widgets.smoke.kcover.test"), 30)
    custom = _api(k8s.CustomObjectsApi, k8s_api)

    def create(name: str, spec: dict[str, Any]) -> Any:
        body = {
            "apiVersion": "smoke.kcover.test/v1",
            "kind": "Widget",
            "metadata": {"name": name},
            "spec": spec,
        }
        return custom.create_namespaced_custom_object(
            "smoke.kcover.test", "v1", test_namespace, "widgets", body
        )

    # Discovery of a new CRD can lag a moment behind Established.
    created = test_cluster.wait_for(
        lambda: _try(lambda: create("ok", {"replicas": 2})), 30, "widget created"
    )
    assert created["spec"]["replicas"] == 2
    assert _status(lambda: create("bad", {"replicas": 0})) == 422
    assert _status(lambda: create("worse", {"replicas": "many"})) == 422


def _try(call: Any) -> Any:
    try:
        return call()
    except ApiException as err:
        if err.status == 404:
            return None
        raise


def test_indexed_job_pods_run_fail_and_are_garbage_collected(
    test_cluster: TestCluster, k8s_api: Any, test_namespace: str
) -> None:
    batch = _api(k8s.BatchV1Api, k8s_api)
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "train"},
        "spec": {
            "completionMode": "Indexed",
            "completions": 3,
            "parallelism": 3,
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "trainer",
                            "image": "example.invalid/trainer:1",
                            "resources": {"limits": {"nvidia.com/gpu": "4"}},
                        }
                    ],
                }
            },
        },
    }
    batch.create_namespaced_job(test_namespace, job)
    selector = "job-name=train"

    def all_running() -> list[Any] | None:
        pods = _pods(k8s_api, test_namespace, selector)
        return pods if len(pods) == 3 and all(p.status.phase == "Running" for p in pods) else None

    pods = test_cluster.wait_for(all_running, 60, "3 Running pods of the Indexed Job")
    indexes = sorted(
        p.metadata.annotations["batch.kubernetes.io/job-completion-index"] for p in pods
    )
    assert indexes == ["0", "1", "2"]
    assert all(p.spec.node_name for p in pods), "the scheduler bound every pod to a KWOK node"

    victim = next(
        p for p in pods if p.metadata.annotations["batch.kubernetes.io/job-completion-index"] == "1"
    )
    failed = test_cluster.fail_pod(
        test_namespace, victim.metadata.name, exit_code=42, reason="Error", message="NCCL timeout"
    )
    state = failed["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (state["exitCode"], state["reason"], state["message"]) == (42, "Error", "NCCL timeout")

    def job_failed() -> bool:
        status = batch.read_namespaced_job_status("train", test_namespace).status
        return bool(status.failed) and any(
            c.type == "Failed" and c.status == "True" for c in status.conditions or []
        )

    test_cluster.wait_for(
        job_failed, 60, "the Job controller to mark the Job Failed (backoffLimit 0)"
    )

    batch.delete_namespaced_job("train", test_namespace, propagation_policy="Background")
    test_cluster.wait_for(
        lambda: not _pods(k8s_api, test_namespace, selector),
        60,
        "the garbage collector to remove the pods",
    )


def test_stale_resource_version_conflicts(k8s_api: Any, test_namespace: str) -> None:
    core = _api(k8s.CoreV1Api, k8s_api)
    cm = core.create_namespaced_config_map(
        test_namespace, {"metadata": {"name": "state"}, "data": {"step": "1"}}
    )
    stale = cm.metadata.resource_version
    core.replace_namespaced_config_map(
        "state",
        test_namespace,
        {"metadata": {"name": "state", "resourceVersion": stale}, "data": {"step": "2"}},
    )
    body = {"metadata": {"name": "state", "resourceVersion": stale}, "data": {"step": "3"}}
    assert _status(lambda: core.replace_namespaced_config_map("state", test_namespace, body)) == 409


def test_rbac_denies_restricted_identities(test_cluster: TestCluster, test_namespace: str) -> None:
    rbac_role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "pod-reader", "namespace": test_namespace},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}],
    }
    test_cluster.apply(
        f"/apis/rbac.authorization.k8s.io/v1/namespaces/{test_namespace}/roles/pod-reader",
        rbac_role,
    )
    user = test_cluster.user(
        "alice", groups=["kcover-testers"], roles={test_namespace: ["pod-reader"]}
    )
    robot = test_cluster.service_account(test_namespace, "robot", roles=["pod-reader"])
    for creds in (user, robot):
        api = kubernetes.config.new_client_from_config(config_file=str(creds.kubeconfig))
        core = _api(k8s.CoreV1Api, api)

        def allowed(core: Any = core) -> bool:
            try:
                core.list_namespaced_pod(test_namespace)
            except ApiException as err:
                if err.status == 403:
                    return False  # the RoleBinding may not be in the authorizer's cache yet
                raise
            return True

        test_cluster.wait_for(allowed, 10, f"{creds.user} may list pods")
        assert _status(lambda core=core: core.list_namespaced_secret(test_namespace)) == 403
        assert _status(lambda core=core: core.list_pod_for_all_namespaces()) == 403
        api.close()
    # An unknown bearer token is not authenticated at all.
    bogus = test_cluster.api.__class__(
        test_cluster.server, str(test_cluster.ca_file), "not-a-token"
    )
    assert bogus.raw("GET", f"/api/v1/namespaces/{test_namespace}/pods")[0] == 401


def test_container_logs_are_cri_files(
    test_cluster: TestCluster, k8s_api: Any, test_namespace: str
) -> None:
    core = _api(k8s.CoreV1Api, k8s_api)
    pod = {
        "metadata": {"name": "rank-0"},
        "spec": {"containers": [{"name": "trainer", "image": "example.invalid/t:1"}]},
    }
    core.create_namespaced_pod(test_namespace, pod)
    test_cluster.wait_pod_phase(test_namespace, "rank-0", "Running", 60)
    path = test_cluster.write_container_log(
        test_namespace, "rank-0", "trainer", ["step 1", "x" * 20000]
    )
    uid = core.read_namespaced_pod("rank-0", test_namespace).metadata.uid
    assert path == test_cluster.log_root / f"{test_namespace}_rank-0_{uid}" / "trainer" / "0.log"
    lines = path.read_text().splitlines()
    assert lines[0].split(" ", 3)[1:] == ["stdout", "F", "step 1"]
    assert [line.split(" ")[2] for line in lines[1:]] == ["P", "F"]


def test_jobset_controller_creates_jobs(
    jobset_controller: TestCluster, k8s_api: Any, test_namespace: str
) -> None:
    jobset: dict[str, Any] = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "js"},
        "spec": {
            "replicatedJobs": [
                {
                    "name": "workers",
                    "replicas": 2,
                    "template": {
                        "spec": {
                            "parallelism": 1,
                            "completions": 1,
                            "backoffLimit": 0,
                            "template": {
                                "spec": {
                                    "restartPolicy": "Never",
                                    "containers": [{"name": "w", "image": "example.invalid/w:1"}],
                                }
                            },
                        }
                    },
                }
            ]
        },
    }
    custom = _api(k8s.CustomObjectsApi, k8s_api)
    invalid = {
        **jobset,
        "metadata": {"name": "js-bad"},
        "spec": {
            **jobset["spec"],
            "successPolicy": {"operator": "All", "targetReplicatedJobs": ["nope"]},
        },
    }
    # The JobSet validating webhook (served by the controller on loopback) says no.
    code = _status(
        lambda: custom.create_namespaced_custom_object(
            "jobset.x-k8s.io", "v1alpha2", test_namespace, "jobsets", invalid
        )
    )
    assert code in (400, 403, 422)
    custom.create_namespaced_custom_object(
        "jobset.x-k8s.io", "v1alpha2", test_namespace, "jobsets", jobset
    )

    def running() -> bool:
        pods = _pods(k8s_api, test_namespace, "jobset.sigs.k8s.io/jobset-name=js")
        return len(pods) == 2 and all(p.status.phase == "Running" for p in pods)

    jobset_controller.wait_for(running, 60, "the JobSet's 2 pods Running")


def test_training_operator_runs_pytorchjob(
    training_operator: TestCluster, k8s_api: Any, test_namespace: str
) -> None:
    def replica(count: int) -> dict[str, Any]:
        return {
            "replicas": count,
            "restartPolicy": "OnFailure",
            "template": {
                "spec": {"containers": [{"name": "pytorch", "image": "example.invalid/pt:1"}]}
            },
        }

    job = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "pt"},
        "spec": {"pytorchReplicaSpecs": {"Master": replica(1), "Worker": replica(2)}},
    }
    custom = _api(k8s.CustomObjectsApi, k8s_api)
    bad = {
        **job,
        "metadata": {"name": "pt-bad"},
        "spec": {
            "pytorchReplicaSpecs": {
                "Master": {
                    **replica(1),
                    "template": {"spec": {"containers": [{"name": "x", "image": "i"}]}},
                }
            }
        },
    }
    # The training-operator's validating webhook wants a container named "pytorch".
    code = _status(
        lambda: custom.create_namespaced_custom_object(
            "kubeflow.org", "v1", test_namespace, "pytorchjobs", bad
        )
    )
    assert code in (400, 403, 422)
    custom.create_namespaced_custom_object("kubeflow.org", "v1", test_namespace, "pytorchjobs", job)

    def running() -> bool:
        pods = _pods(k8s_api, test_namespace, "training.kubeflow.org/job-name=pt")
        return len(pods) == 3 and all(p.status.phase == "Running" for p in pods)

    training_operator.wait_for(running, 90, "the PyTorchJob's 3 pods Running")


def test_a_component_that_dies_is_reported_with_its_log(test_cluster: TestCluster) -> None:
    # A second, private cluster (the session's must survive): kill its scheduler.
    with TestCluster(test_cluster.binaries) as other:
        assert other.server != test_cluster.server
        victim = other.component("kube-scheduler")
        assert victim.proc is not None
        victim.proc.kill()
        victim.proc.wait(10)
        with pytest.raises(ComponentDiedError) as info:
            other.check()
        assert "kube-scheduler" in str(info.value)
        assert str(victim.log_path) in str(info.value)
        workdir = other.workdir
    assert not workdir.exists()
    assert all(not comp.alive() for comp in other.components)


def test_kubectl_and_helm_work_against_the_cluster(
    test_cluster: TestCluster, test_namespace: str, tmp_path: Path
) -> None:
    for tool in ("kubectl", "helm"):
        if not test_cluster.binaries.has(tool):
            pytest.skip(f"{tool} not available: {test_cluster.binaries.why_missing(tool)}")
    nodes = test_cluster.run_tool("kubectl", "get", "nodes", "-l", "type=kwok", "-o", "name")
    assert nodes.returncode == 0, nodes.stderr
    assert "node/kwok-node-0" in nodes.stdout
    chart = tmp_path / "tiny"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: tiny\nversion: 0.1.0\n")
    (chart / "templates" / "cm.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}-cm\ndata:\n  k: v\n"
    )
    done = test_cluster.run_tool(
        "helm", "install", "demo", str(chart), "-n", test_namespace, "--wait"
    )
    assert done.returncode == 0, done.stderr
    got = test_cluster.run_tool(
        "kubectl", "get", "configmap", "demo-cm", "-n", test_namespace, "-o", "jsonpath={.data.k}"
    )
    assert got.stdout == "v"
