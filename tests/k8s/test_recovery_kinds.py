"""Restarts of each job kind on the real control plane, with the kind's real controller.

A batch Job whose pods crashed (Failed, as NCCL errors end them), a JobSet
(jobset controller) and a Kubeflow PyTorchJob (training-operator): an Xid 79 in
one rank's log, NCCL errors in the others' → every pod replaced by a fresh
one, only the Xid's node quarantined, the job running again.  Also: a node that
``kcover preflight`` refused is excluded the same way.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from tests.k8s.conftest import Processes, indexed_job, wait_until
from tests.k8s.test_recovery_e2e import REMOTE, XID, leader, recovery, start_kcover

from kcover.testing import TestCluster

CONTAINER = {"name": "trainer", "image": "trainer:v1", "resources": {"limits": {"nvidia.com/gpu": "2"}}}


def pods_of(core: client.CoreV1Api, namespace: str, selector: str) -> list[Any]:
    return [p for p in core.list_namespaced_pod(namespace, label_selector=selector).items
            if p.status.phase == "Running" and not p.metadata.deletion_timestamp]


def custom_recovery(custom: client.CustomObjectsApi, plural: str, namespace: str, name: str) -> dict[str, Any]:
    group, version = {"jobsets": ("jobset.x-k8s.io", "v1alpha2"), "pytorchjobs": ("kubeflow.org", "v1")}[plural]
    body = custom.get_namespaced_custom_object(group, version, namespace, plural, name)
    return dict(json.loads(body["metadata"].get("annotations", {}).get("kcover.io/recovery", "{}")))


def recover_from_a_node_fault(cluster: TestCluster, api: Any, namespace: str, nodes: list[str], processes: Processes,
                        tmp_path: Path, selector: str, count: int, state: Callable[[], dict[str, Any]],
                        crash: bool = False, identity: str = "op-a", cause: str = XID,
                        category: str = "gpu_hardware") -> None:
    """Write the incident (``cause`` in one pod's log, NCCL errors in the others') and crash the pods if asked,
    then check the restart and that only the faulty pod's node was quarantined."""
    core = client.CoreV1Api(api)
    pods = wait_until(lambda: (p := pods_of(core, namespace, selector)) and len(p) == count and p, 60,
                      f"{count} pods Running")
    start_kcover(cluster, processes, nodes, tmp_path, namespace, identity=identity)
    bad = pods[-1]
    for rank, pod in enumerate(pods):
        container = pod.spec.containers[0].name
        line = cause.format(node=pod.spec.node_name) if pod.metadata.uid == bad.metadata.uid else REMOTE.format(r=rank)
        cluster.write_container_log(namespace, pod.metadata.name, container, ["step 7 loss 1.9", line])
    if crash:  # a rank logs, then exits: with the agents running, the record of the cause comes first
        wait_until(lambda: "kcover.io/faults" in (core.read_namespaced_pod(
            bad.metadata.name, namespace).metadata.annotations or {}), 30, "the agent's record of the Xid")
        for pod in pods:
            cluster.fail_pod(namespace, pod.metadata.name, exit_code=1, wait=False)
    old = {p.metadata.uid for p in pods}
    wait_until(lambda: state().get("phase") == "running", 60, lambda: f"restart done; recovery {state()}")
    renewed = wait_until(lambda: (p := pods_of(core, namespace, selector)) and len(p) == count
                         and not {x.metadata.uid for x in p} & old and p, 60,
                         lambda: f"{count} new pods Running; have "
                                 f"{[(p.metadata.name, p.status.phase) for p in pods_of(core, namespace, selector)]}")
    record = state()
    assert (record["restarts"], record["last"]["category"]) == (1, category)
    assert record["last"]["nodes"] == [bad.spec.node_name]
    assert all(p.spec.node_name != bad.spec.node_name for p in renewed)
    assert [n for n in nodes if core.read_node(n).spec.unschedulable] == [bad.spec.node_name]


def test_a_batch_job_whose_pods_crashed_is_restarted(
        test_cluster: TestCluster, k8s_api: Any, test_namespace: str, gpu_nodes: list[str],
        kcover_processes: Processes, tmp_path: Path) -> None:
    batch = client.BatchV1Api(k8s_api)
    old_uid = batch.create_namespaced_job(test_namespace, indexed_job("crashed", test_namespace, 4)).metadata.uid
    recover_from_a_node_fault(test_cluster, k8s_api, test_namespace, gpu_nodes, kcover_processes, tmp_path,
                        "batch.kubernetes.io/job-name=crashed", 4,
                        partial(recovery, batch, test_namespace, "crashed"), crash=True)
    new_uid = batch.read_namespaced_job("crashed", test_namespace).metadata.uid
    assert new_uid != old_uid
    core = client.CoreV1Api(k8s_api)

    def on_new_job() -> list[str]:
        return [e.message for e in core.list_namespaced_event(test_namespace).items
                if e.involved_object.uid == new_uid and e.reason == "KcoverRestart"]

    messages = wait_until(on_new_job, 10, "a KcoverRestart event on the new Job (kubectl describe shows it)")
    assert len(messages) == 1 and messages[0].startswith("created again by kcover: restart 1/3"), messages


def test_a_node_its_preflight_refused_is_excluded(
        test_cluster: TestCluster, k8s_api: Any, test_namespace: str, gpu_nodes: list[str],
        kcover_processes: Processes, tmp_path: Path) -> None:
    """The line ``kcover preflight --pairwise`` logs on a slow node → the operator quarantines that node."""
    batch = client.BatchV1Api(k8s_api)
    batch.create_namespaced_job(test_namespace, indexed_job("gated", test_namespace, 4))
    slow = "kcover preflight: node {node} failed: slow in every pairing ({node}; more than 2x the median pair's 0.4 s)"
    recover_from_a_node_fault(test_cluster, k8s_api, test_namespace, gpu_nodes, kcover_processes, tmp_path,
                        "batch.kubernetes.io/job-name=gated", 4, partial(recovery, batch, test_namespace, "gated"),
                        crash=True, cause=slow, category="host_system")


def test_a_leader_that_dies_between_deleting_and_creating_the_job_loses_nothing(
        test_cluster: TestCluster, k8s_api: Any, test_namespace: str, gpu_nodes: list[str],
        kcover_processes: Processes, tmp_path: Path) -> None:
    batch = client.BatchV1Api(k8s_api)
    batch.create_namespaced_job(test_namespace, indexed_job("crashed", test_namespace, 4))
    doomed = kcover_processes.start(["operator", "--kubeconfig", str(test_cluster.kubeconfig), "--namespace",
                                     test_namespace, "--lease-seconds", "3", "--identity", "doomed"],
                                    tmp_path / "doomed.log", env={"KCOVER_OPERATOR_FAILPOINT": "after-recreate-delete"})
    coordination = client.CoordinationV1Api(k8s_api)
    wait_until(lambda: leader(coordination, test_namespace) == "doomed", 30, "the doomed operator to lead")
    recover_from_a_node_fault(test_cluster, k8s_api, test_namespace, gpu_nodes, kcover_processes, tmp_path,
                        "batch.kubernetes.io/job-name=crashed", 4, partial(recovery, batch, test_namespace,
                                                                           "crashed"), crash=True, identity="op-b")
    assert doomed.poll() == 86, "the first leader died at the failpoint"
    assert leader(coordination, test_namespace) == "op-b"
    core = client.CoreV1Api(k8s_api)
    # the new Job's pods may run before the leader has handed the evidence over and dropped the saved manifest
    wait_until(lambda: not core.list_namespaced_config_map(test_namespace, label_selector="kcover.io/recreate-for")
               .items, 10, "the saved manifest dropped")
    evidence = core.list_namespaced_config_map(test_namespace, label_selector="kcover.io/evidence-for=crashed").items
    new_uid = batch.read_namespaced_job("crashed", test_namespace).metadata.uid
    assert len(evidence) == 1 and [o.uid for o in evidence[0].metadata.owner_references or []] == [new_uid]


def jobset(name: str, namespace: str, crashes_ignored: bool = False) -> dict[str, Any]:
    pod_spec = {"restartPolicy": "Never", "nodeSelector": {"kcover-test": namespace}, "containers": [CONTAINER]}
    job_spec: dict[str, Any] = {"parallelism": 2, "completions": 2, "completionMode": "Indexed", "backoffLimit": 0,
                                "template": {"spec": pod_spec}}
    if crashes_ignored:  # as a batch Job must have it: a crashed rank does not fail its Job
        job_spec["podFailurePolicy"] = {"rules": [{"action": "Ignore",
                                                   "onExitCodes": {"operator": "NotIn", "values": [0]}}]}
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": name, "labels": {"kcover.io/cascading-recovery": "true"}},
            "spec": {"replicatedJobs": [{"name": "workers", "replicas": 2, "template": {"spec": job_spec}}]}}


@pytest.mark.parametrize("crash", [False, True], ids=["running", "pods-crashed"])
def test_a_jobset_is_restarted_through_its_controller(
        jobset_controller: TestCluster, k8s_api: Any, test_namespace: str, gpu_nodes: list[str],
        kcover_processes: Processes, tmp_path: Path, crash: bool) -> None:
    """With crashed pods the child Jobs are renewed: the Job controller would hold their new pods back
    (10 s × 2^(n−1) after n failed pods, up to 6 min) and forgets that only when a Job is deleted."""
    custom, batch = client.CustomObjectsApi(k8s_api), client.BatchV1Api(k8s_api)
    custom.create_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", test_namespace, "jobsets",
                                           jobset("js", test_namespace, crashes_ignored=crash))
    selector = "jobset.sigs.k8s.io/jobset-name=js"

    def children() -> set[str]:
        return {j.metadata.uid for j in batch.list_namespaced_job(test_namespace, label_selector=selector).items}

    before = wait_until(lambda: (c := children()) and len(c) == 2 and c, 30, "2 child Jobs")
    recover_from_a_node_fault(jobset_controller, k8s_api, test_namespace, gpu_nodes, kcover_processes, tmp_path,
                        selector, 4, lambda: custom_recovery(custom, "jobsets", test_namespace, "js"), crash=crash)
    after = children()
    assert len(after) == 2
    assert after.isdisjoint(before) is crash  # crashed: all renewed; running: the same two, suspended and resumed


def test_a_pytorchjob_is_restarted_through_the_training_operator(
        training_operator: TestCluster, k8s_api: Any, test_namespace: str, gpu_nodes: list[str],
        kcover_processes: Processes, tmp_path: Path) -> None:
    custom = client.CustomObjectsApi(k8s_api)

    def replicas(count: int) -> dict[str, Any]:
        container = {**CONTAINER, "name": "pytorch"}
        return {"replicas": count, "restartPolicy": "OnFailure", "template": {"spec": {
            "nodeSelector": {"kcover-test": test_namespace}, "containers": [container]}}}

    job = {
        "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
        "metadata": {"name": "pt", "labels": {"kcover.io/cascading-recovery": "true"}},
        "spec": {"pytorchReplicaSpecs": {"Master": replicas(1), "Worker": replicas(3)}},
    }
    custom.create_namespaced_custom_object("kubeflow.org", "v1", test_namespace, "pytorchjobs", job)
    recover_from_a_node_fault(training_operator, k8s_api, test_namespace, gpu_nodes, kcover_processes, tmp_path,
                        "training.kubeflow.org/job-name=pt", 4,
                        lambda: custom_recovery(custom, "pytorchjobs", test_namespace, "pt"))
