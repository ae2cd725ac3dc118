"""End to end on the real control plane: agents read pod logs, the operator restarts, quarantines, fails.

Everything is real except the kubelet (KWOK) and the training processes: logs
are CRI files written where the kubelet would write them, exits are set through
KWOK stages.  The operator and one agent per node run as ``kcover`` processes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kubernetes import client
from tests.k8s.conftest import Processes, indexed_job, wait_until

from kcover.testing import TestCluster

XID = "NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python, GPU has fallen off the bus."
REMOTE = ("[rank{r}]: torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, "
          "remote process exited or there was a network error, NCCL version 2.20.5")


def job_pods(core: client.CoreV1Api, namespace: str, job: str, running_only: bool = True) -> list[Any]:
    pods = core.list_namespaced_pod(namespace, label_selector=f"batch.kubernetes.io/job-name={job}").items
    return [p for p in pods if not running_only or (p.status.phase == "Running" and not p.metadata.deletion_timestamp)]


def pod_states(core: client.CoreV1Api, namespace: str, job: str) -> list[tuple[str, str, str, bool]]:
    return [(p.metadata.name, p.status.phase, p.spec.node_name, bool(p.metadata.deletion_timestamp))
            for p in job_pods(core, namespace, job, running_only=False)]


def start_kcover(cluster: TestCluster, processes: Processes, nodes: list[str], tmp_path: Path, namespace: str,
                 kubeconfig: Path | None = None, agent_kubeconfig: Path | None = None, identity: str = "op-a") -> None:
    config = str(kubeconfig or cluster.kubeconfig)
    processes.start(["operator", "--kubeconfig", config, "--namespace", namespace, "--lease-seconds", "3",
                     "--identity", identity], tmp_path / f"operator-{identity}.log")
    config = str(agent_kubeconfig or kubeconfig or cluster.kubeconfig)
    for node in nodes:
        (tmp_path / f"{node}.kmsg").touch()
        processes.start(["agent", "--node", node, "--log-root", str(cluster.log_root), "--kmsg",
                         str(tmp_path / f"{node}.kmsg"), "--state-dir", str(tmp_path / "agent"),
                         "--kubeconfig", config, "--health-interval", "0"], tmp_path / f"agent-{node}.log")


def leader(coordination: client.CoordinationV1Api, namespace: str) -> str | None:
    try:
        return str(coordination.read_namespaced_lease("kcover-operator", namespace).spec.holder_identity)
    except client.exceptions.ApiException:
        return None


def recovery(batch: client.BatchV1Api, namespace: str, name: str) -> dict[str, Any]:
    try:
        annotations = batch.read_namespaced_job(name, namespace).metadata.annotations or {}
    except client.exceptions.ApiException as error:
        assert error.status == 404  # a Job whose pods failed is replaced: between the old one and the new one
        return {}
    return dict(json.loads(annotations.get("kcover.io/recovery", "{}")))


def test_xid_on_one_node_restarts_all_pods_and_quarantines_only_that_node(
        test_cluster: TestCluster, k8s_api: Any, test_namespace: str, gpu_nodes: list[str],
        kcover_processes: Processes, tmp_path: Path) -> None:
    xid_scenario(test_cluster, k8s_api, test_namespace, gpu_nodes, kcover_processes, tmp_path)


def xid_scenario(test_cluster: TestCluster, k8s_api: Any, test_namespace: str, gpu_nodes: list[str],
                 kcover_processes: Processes, tmp_path: Path, operator_config: Path | None = None,
                 agent_config: Path | None = None, crash: bool = False) -> None:
    """8 pods on 4 nodes; Xid 79 in one rank's log, NCCL remote errors in the others' (and, with ``crash``,
    every pod exits 1, so the Job is replaced)."""
    core, batch = client.CoreV1Api(k8s_api), client.BatchV1Api(k8s_api)
    batch.create_namespaced_job(test_namespace, indexed_job("train", test_namespace, 8))
    pods = wait_until(lambda: (p := job_pods(core, test_namespace, "train")) and len(p) == 8 and p, 30, "8 pods")
    start_kcover(test_cluster, kcover_processes, gpu_nodes, tmp_path, test_namespace, operator_config, agent_config)
    bad = next(p for p in pods if p.spec.node_name == gpu_nodes[2]) if any(
        p.spec.node_name == gpu_nodes[2] for p in pods) else pods[5]
    bad_node = bad.spec.node_name
    for rank, pod in enumerate(pods):
        lines = ["step 100 loss 2.1"] + ([XID] if pod.metadata.uid == bad.metadata.uid else [REMOTE.format(r=rank)])
        test_cluster.write_container_log(test_namespace, pod.metadata.name, "trainer", lines)
    for pod in pods if crash else []:
        test_cluster.fail_pod(test_namespace, pod.metadata.name, exit_code=1, wait=False)
    old = {p.metadata.uid for p in pods}
    wait_until(lambda: recovery(batch, test_namespace, "train").get("phase") == "running", 30, "restart done")
    state = recovery(batch, test_namespace, "train")
    assert state["restarts"] == 1
    assert state["last"]["category"] == "gpu_hardware"
    assert state["last"]["nodes"] == [bad_node]
    renewed = wait_until(lambda: (p := job_pods(core, test_namespace, "train")) and len(p) == 8
                         and not {x.metadata.uid for x in p} & old and p, 30,
                         lambda: f"8 new pods Running; have {pod_states(core, test_namespace, 'train')}; "
                                 f"job {batch.read_namespaced_job('train', test_namespace).status}")
    assert all(p.spec.node_name != bad_node for p in renewed)
    nodes = {n: core.read_node(n) for n in gpu_nodes}
    quarantined = [n for n, body in nodes.items() if body.spec.unschedulable]
    assert quarantined == [bad_node]
    taints = [t.key for t in nodes[bad_node].spec.taints or []]
    assert "kcover.io/quarantine" in taints
    events = core.list_namespaced_event(test_namespace).items
    reasons = {e.reason for e in events}
    assert {"KcoverFault", "KcoverRestart", "KcoverQuarantine"} <= reasons
    evidence = core.list_namespaced_config_map(test_namespace, label_selector="kcover.io/evidence-for=train").items
    assert len(evidence) == 1
    assert XID in "".join(evidence[0].data.values())


def test_same_key_error_everywhere_fails_fast_with_the_reason(
        test_cluster: TestCluster, k8s_api: Any, test_namespace: str, gpu_nodes: list[str],
        kcover_processes: Processes, tmp_path: Path) -> None:
    core, batch = client.CoreV1Api(k8s_api), client.BatchV1Api(k8s_api)
    body = indexed_job("buggy", test_namespace, 4)
    body["metadata"]["annotations"] = {"kcover.io/user-code-retries": "0", "kcover.io/max-restarts": "lots"}
    batch.create_namespaced_job(test_namespace, body)
    start_kcover(test_cluster, kcover_processes, gpu_nodes, tmp_path, test_namespace)
    pods = wait_until(lambda: (p := job_pods(core, test_namespace, "buggy")) and len(p) == 4 and p, 30, "4 pods")
    for pod in pods:
        test_cluster.write_container_log(test_namespace, pod.metadata.name, "trainer", [
            "Traceback (most recent call last):", '  File "train.py", line 9, in <module>',
            "    batch['labels']", "KeyError: 'labels'"])
        test_cluster.fail_pod(test_namespace, pod.metadata.name, exit_code=1, wait=False)
    wait_until(lambda: recovery(batch, test_namespace, "buggy").get("phase") == "failed", 30, "failed")
    job = batch.read_namespaced_job("buggy", test_namespace)
    assert job.spec.suspend is True
    assert "deterministic user error" in job.metadata.annotations["kcover.io/reason"]
    assert recovery(batch, test_namespace, "buggy")["restarts"] == 0
    assert not any(core.read_node(n).spec.unschedulable for n in gpu_nodes)
    events = core.list_namespaced_event(test_namespace).items
    assert len([e for e in events if e.reason == "KcoverFailed"]) == 1
    bad = [e.message for e in events if e.reason == "KcoverBadAnnotation"]
    assert bad and "kcover.io/max-restarts='lots'" in bad[0]


def test_job_without_the_label_is_never_touched(
        test_cluster: TestCluster, k8s_api: Any, test_namespace: str, gpu_nodes: list[str],
        kcover_processes: Processes, tmp_path: Path) -> None:
    core, batch = client.CoreV1Api(k8s_api), client.BatchV1Api(k8s_api)
    batch.create_namespaced_job(test_namespace, indexed_job("plain", test_namespace, 2, opted_in=False))
    pods = wait_until(lambda: (p := job_pods(core, test_namespace, "plain")) and len(p) == 2 and p, 30, "2 pods")
    start_kcover(test_cluster, kcover_processes, gpu_nodes, tmp_path, test_namespace)
    test_cluster.write_container_log(test_namespace, pods[0].metadata.name, "trainer", [XID])
    test_cluster.fail_pod(test_namespace, pods[0].metadata.name, exit_code=137, reason="Error")
    import time

    time.sleep(4)
    job = batch.read_namespaced_job("plain", test_namespace)
    assert not any(k.startswith("kcover.io/") for k in (job.metadata.annotations or {}))
    assert core.read_namespaced_pod(pods[1].metadata.name, test_namespace).metadata.deletion_timestamp is None
    assert not any(core.read_node(n).spec.unschedulable for n in gpu_nodes)
    assert not any(e.reason.startswith("Kcover") for e in core.list_namespaced_event(test_namespace).items)


def test_an_operator_killed_right_after_claiming_is_finished_by_the_next_leader_exactly_once(
        test_cluster: TestCluster, k8s_api: Any, test_namespace: str, gpu_nodes: list[str],
        kcover_processes: Processes, tmp_path: Path) -> None:
    """op-a dies (a real process exit) between the claim and everything else; op-b keeps the evidence,
    quarantines, restarts, once."""
    core, batch = client.CoreV1Api(k8s_api), client.BatchV1Api(k8s_api)
    batch.create_namespaced_job(test_namespace, indexed_job("resume", test_namespace, 4))
    pods = wait_until(lambda: (p := job_pods(core, test_namespace, "resume")) and len(p) == 4 and p, 30, "4 pods")
    config = str(test_cluster.kubeconfig)
    doomed = kcover_processes.start(["operator", "--kubeconfig", config, "--namespace", test_namespace,
                                     "--lease-seconds", "3", "--identity", "op-a"], tmp_path / "op-a.log",
                                    env={"KCOVER_OPERATOR_FAILPOINT": "after-claim"})
    coordination = client.CoordinationV1Api(k8s_api)
    wait_until(lambda: leader(coordination, test_namespace) == "op-a", 30, "op-a to lead")
    start_kcover(test_cluster, kcover_processes, gpu_nodes, tmp_path, test_namespace, identity="op-b")
    bad = pods[1]
    for rank, pod in enumerate(pods):
        line = XID if pod.metadata.uid == bad.metadata.uid else REMOTE.format(r=rank)
        test_cluster.write_container_log(test_namespace, pod.metadata.name, "trainer", [line])
    wait_until(lambda: doomed.poll() is not None, 30, "op-a to die at the failpoint")
    assert doomed.returncode == 86
    assert recovery(batch, test_namespace, "resume")["phase"] == "restarting"
    wait_until(lambda: recovery(batch, test_namespace, "resume").get("phase") == "running", 30, "restart finished")
    old = {p.metadata.uid for p in pods}
    wait_until(lambda: (p := job_pods(core, test_namespace, "resume")) and len(p) == 4
               and not {x.metadata.uid for x in p} & old, 30, "4 new pods")
    state = recovery(batch, test_namespace, "resume")
    assert (state["restarts"], state["attempt"]) == (1, 2)
    assert leader(coordination, test_namespace) == "op-b"
    events = core.list_namespaced_event(test_namespace).items
    assert len([e for e in events if e.reason == "KcoverRestart"]) == 1
    assert len([e for e in events if e.reason == "KcoverQuarantine"]) == 1
    assert [n for n in gpu_nodes if core.read_node(n).spec.unschedulable] == [bad.spec.node_name]
    evidence = core.list_namespaced_config_map(test_namespace, label_selector="kcover.io/evidence-for=resume").items
    assert len(evidence) == 1 and XID in "".join(evidence[0].data.values())


def test_pods_that_stop_making_progress_are_restarted_as_a_hang(
        test_cluster: TestCluster, k8s_api: Any, test_namespace: str, gpu_nodes: list[str],
        kcover_processes: Processes, tmp_path: Path) -> None:
    core, batch = client.CoreV1Api(k8s_api), client.BatchV1Api(k8s_api)
    body = indexed_job("stuck", test_namespace, 2)
    body["metadata"]["annotations"] = {"kcover.io/hang-timeout": "3"}
    batch.create_namespaced_job(test_namespace, body)
    pods = wait_until(lambda: (p := job_pods(core, test_namespace, "stuck")) and len(p) == 2 and p, 30, "2 pods")
    start_kcover(test_cluster, kcover_processes, gpu_nodes, tmp_path, test_namespace)
    for step in range(1, 4):
        for pod in pods:
            test_cluster.write_container_log(test_namespace, pod.metadata.name, "trainer", [f"step {step} loss 2.0"])
        import time

        time.sleep(0.5)
    # then nothing: every rank is stuck in a collective
    wait_until(lambda: recovery(batch, test_namespace, "stuck").get("restarts") == 1, 30, "a restart for the hang")
    last = recovery(batch, test_namespace, "stuck")["last"]
    assert last["category"] == "collective_timeout_hang"
    assert last["rule"] == "job.no-progress"
    assert not any(core.read_node(n).spec.unschedulable for n in gpu_nodes)
