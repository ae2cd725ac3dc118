"""``kcover inject``: a rehearsed fault through the real agent and the real API server, and only an admin's.

The agent runs as a real process with a token bound to exactly the chart's
roles; the request is a ``FaultInjection`` in kcover's namespace (a second
fresh namespace here).  An Xid goes through the agent's kernel-log path and
ends on the target pod as a real one would; a process fault becomes the order
``kcover pod`` reads; a request anywhere else, or from a user who may only
edit the job, does nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from tests.k8s.conftest import Processes, indexed_job, wait_until
from tests.k8s.test_chart import render

from kcover.cli import main as cli_main
from kcover.k8s.wire import PodStatus
from kcover.launcher.inject import InjectKind
from kcover.launcher.pod_inject import parse_order
from kcover.podline import PodState
from kcover.testing import TestCluster

CRD = Path(__file__).resolve().parents[2] / "charts" / "kcover" / "crds" / "faultinjections.kcover.io.yaml"
GROUP, VERSION, PLURAL = "kcover.io", "v1alpha1", "faultinjections"
ORDER_VOLUME = {"name": "kcover", "downwardAPI": {"items": [
    {"path": "generation", "fieldRef": {"fieldPath": "metadata.annotations['kcover.io/generation']"}},
    {"path": "inject", "fieldRef": {"fieldPath": "metadata.annotations['kcover.io/inject']"}}]}}


@pytest.fixture
def kcover_namespace(test_cluster: TestCluster, k8s_api: Any) -> Iterator[str]:
    """kcover's own namespace for one test, with the CRD and the chart's roles for the agent."""
    test_cluster.install_crds([CRD])
    name = test_cluster.create_namespace(f"kc-{uuid.uuid4().hex[:10]}")
    rbac = client.RbacAuthorizationV1Api(k8s_api)
    for doc in render(test_cluster, name):
        if doc["kind"] == "ClusterRole" and doc["metadata"]["name"] == "kcover-agent":
            try:
                rbac.replace_cluster_role(doc["metadata"]["name"], doc)
            except client.exceptions.ApiException:
                rbac.create_cluster_role(doc)
        elif doc["kind"] == "Role" and doc["metadata"]["name"] == "kcover-agent-injections":
            rbac.create_namespaced_role(name, doc)
    yield name
    test_cluster.api.request("DELETE", f"/api/v1/namespaces/{name}")


def start_job(k8s_api: Any, namespace: str, name: str, pods: int, kcover_pod: bool = False) -> list[Any]:
    job = indexed_job(name, namespace, pods)
    if kcover_pod:
        job["spec"]["template"]["spec"]["volumes"] = [ORDER_VOLUME]
    client.BatchV1Api(k8s_api).create_namespaced_job(namespace, job)
    core = client.CoreV1Api(k8s_api)

    def running() -> list[Any]:
        found = [p for p in core.list_namespaced_pod(namespace, label_selector=f"batch.kubernetes.io/job-name={name}")
                 .items if p.status.phase == "Running"]
        return sorted(found, key=lambda p: int(p.metadata.annotations["batch.kubernetes.io/job-completion-index"])) \
            if len(found) == pods else []

    return list(wait_until(running, 60, f"{pods} pods of {name} running"))


def start_agent(test_cluster: TestCluster, processes: Processes, node: str, kcover_ns: str, tmp_path: Path) -> None:
    account = test_cluster.service_account(kcover_ns, "kcover-agent", cluster_roles=["kcover-agent"],
                                           roles=["kcover-agent-injections"])
    processes.start(["agent", "--node", node, "--log-root", str(test_cluster.log_root), "--kmsg", "",
                     "--state-dir", str(tmp_path / f"state-{node}"), "--kubeconfig", str(account.kubeconfig),
                     "--health-interval", "0"], tmp_path / f"agent-{node}.log", env={"POD_NAMESPACE": kcover_ns})


def kcover_inject(kubeconfig: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kcover", "inject", *args, "--kubeconfig", str(kubeconfig)],
                          capture_output=True, text=True, timeout=timeout, check=False,
                          env={**os.environ, "COLUMNS": "250"})


def requests(k8s_api: Any, namespace: str) -> list[dict[str, Any]]:
    return list(client.CustomObjectsApi(k8s_api).list_namespaced_custom_object(GROUP, VERSION, namespace,
                                                                                PLURAL)["items"])


def one_line_error(done: subprocess.CompletedProcess[str], *words: str) -> None:
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("kcover: "), done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    for word in words:
        assert word in done.stderr, done.stderr


def test_an_xid_goes_through_the_agents_kernel_path_on_the_targets_node(
        test_cluster: TestCluster, k8s_api: Any, test_namespace: str, kcover_namespace: str, gpu_nodes: list[str],
        kcover_processes: Processes, tmp_path: Path) -> None:
    pods = start_job(k8s_api, test_namespace, "rehearse", 2)
    target = pods[1]
    node = target.spec.node_name
    start_agent(test_cluster, kcover_processes, node, kcover_namespace, tmp_path)
    # a request in any other namespace is not kcover's: never answered, never fired
    elsewhere = client.CustomObjectsApi(k8s_api).create_namespaced_custom_object(GROUP, VERSION, test_namespace,
                                                                                 PLURAL, forged(target))

    done = kcover_inject(test_cluster.kubeconfig, f"{test_namespace}/rehearse", "xid79@rank1", "--namespace",
                         kcover_namespace)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith(f"injected xid79 on pod {target.metadata.name} (rank 1) on node {node}")
    (request,) = requests(k8s_api, kcover_namespace)
    status = request["status"]
    assert status["phase"] == "Done" and status["at"] and "GPU has fallen off the bus" in status["line"]
    assert request["spec"]["node"] == node and request["spec"]["pod"] == target.metadata.name
    core = client.CoreV1Api(k8s_api)
    faults = json.loads(core.read_namespaced_pod(target.metadata.name, test_namespace).metadata.annotations[
        "kcover.io/faults"])
    assert [f["rule"] for f in faults] == ["xid.79.fallen-off-bus"]
    assert faults[0]["source"] == f"{node}/kmsg" and faults[0]["line"] == status["line"]
    conditions = {c.type: c.status for c in core.read_node(node).status.conditions or []}
    assert conditions.get("KcoverHealthy") == "False"
    stranger = client.CustomObjectsApi(k8s_api).get_namespaced_custom_object(
        GROUP, VERSION, test_namespace, PLURAL, elsewhere["metadata"]["name"])
    assert "status" not in stranger


def forged(pod: Any) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "FaultInjection", "metadata": {
        "generateName": "forged-", "labels": {"kcover.io/node": pod.spec.node_name}},
        "spec": {"kind": "xid48", "job": {"kind": "Job", "namespace": pod.metadata.namespace, "name": "rehearse"},
                 "pod": pod.metadata.name, "podUID": pod.metadata.uid, "node": pod.spec.node_name, "rank": 1,
                 "line": "NVRM: Xid (PCI:0000:3b:00): 48, pid=0, name=python, An uncorrectable double bit error"}}


def test_a_process_fault_becomes_the_order_kcover_pod_reads(
        test_cluster: TestCluster, k8s_api: Any, test_namespace: str, kcover_namespace: str, gpu_nodes: list[str],
        kcover_processes: Processes, tmp_path: Path) -> None:
    (pod,) = start_job(k8s_api, test_namespace, "inplace", 1, kcover_pod=True)
    core = client.CoreV1Api(k8s_api)
    start_agent(test_cluster, kcover_processes, pod.spec.node_name, kcover_namespace, tmp_path)
    job = f"{test_namespace}/inplace"

    without = kcover_inject(test_cluster.kubeconfig, job, "crash@rank0", "--namespace", kcover_namespace)
    one_line_error(without, "does not run `kcover pod`", "only xid79 and xid48")
    assert requests(k8s_api, kcover_namespace) == []

    state = PodStatus(0, PodState.RUNNING).encode()
    core.patch_namespaced_pod(pod.metadata.name, test_namespace, {"metadata": {"annotations": {
        "kcover.io/pod-state": state}}})
    done = kcover_inject(test_cluster.kubeconfig, job, f"crash@{pod.spec.node_name}", "--namespace",
                         kcover_namespace)
    assert done.returncode == 0, done.stdout + done.stderr
    order_text = core.read_namespaced_pod(pod.metadata.name, test_namespace).metadata.annotations["kcover.io/inject"]
    order = parse_order(order_text)
    assert order is not None and order.kind is InjectKind.CRASH and order.rank == 0
    (request,) = requests(k8s_api, kcover_namespace)
    assert request["status"]["phase"] == "Done" and request["status"]["line"] == order_text

    # an admin's request made by hand for a pod that cannot act on it is refused by the agent itself
    core.patch_namespaced_pod(pod.metadata.name, test_namespace, {"metadata": {"annotations": {
        "kcover.io/pod-state": None}}})
    body = {**forged(pod), "spec": {**forged(pod)["spec"], "kind": "hang", "line": None, "rank": 0,
                                    "order": "hang@rank0#byhand"}}
    body["spec"] = {k: v for k, v in body["spec"].items() if v is not None}
    made = client.CustomObjectsApi(k8s_api).create_namespaced_custom_object(GROUP, VERSION, kcover_namespace, PLURAL,
                                                                            body)
    answered = wait_until(lambda: client.CustomObjectsApi(k8s_api).get_namespaced_custom_object(
        GROUP, VERSION, kcover_namespace, PLURAL, made["metadata"]["name"]).get("status"), 30, "the agent's answer")
    assert answered["phase"] == "Failed" and "does not run `kcover pod`" in answered["message"]
    assert core.read_namespaced_pod(pod.metadata.name, test_namespace).metadata.annotations[
        "kcover.io/inject"] == order_text


def test_bad_requests_get_one_line_and_nobody_but_an_admin_may_inject(
        test_cluster: TestCluster, k8s_api: Any, test_namespace: str, kcover_namespace: str, gpu_nodes: list[str],
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    (pod,) = start_job(k8s_api, test_namespace, "bad", 1)
    client.BatchV1Api(k8s_api).create_namespaced_job(test_namespace, indexed_job("shy", test_namespace, 1,
                                                                                 opted_in=False))
    admin = test_cluster.kubeconfig
    job = f"{test_namespace}/bad"
    ns = ("--namespace", kcover_namespace)
    for args, words in [
        ((test_namespace, "xid79@rank0"), ("NAMESPACE/NAME",)),
        ((job, "xid99@rank0"), ("unknown kind 'xid99'", "crash, hang, oom")),
        ((job, "slow@rank0"), ("slow is for kcover run only",)),
        ((job, "xid79@rank0:step=3"), ("fires at once",)),
        ((job, "crash"), ("expected KIND@TARGET",)),
        ((job, "xid79@rank5"), ("rank 5 is out of range", "ranks 0–0")),
        ((job, "xid79@no-such-node"), ("no running pod", "on node 'no-such-node'", pod.spec.node_name)),
        ((f"{test_namespace}/nope", "xid79@rank0"), (f"no Job, JobSet or PyTorchJob named {test_namespace}/nope",)),
        ((f"{test_namespace}/shy", "xid79@rank0"), ("has not opted in",)),
        ((job, "hang@rank0"), ("does not run `kcover pod`",)),
    ]:
        one_line_error(kcover_inject(admin, *args, *ns), *words)

    # a user who may edit the job, and even edit in kcover's namespace, may not create the request
    editor = test_cluster.user(f"editor-{uuid.uuid4().hex[:6]}")
    test_cluster.bind(editor, "edit", namespace=test_namespace)
    test_cluster.bind(editor, "edit", namespace=kcover_namespace)
    one_line_error(kcover_inject(editor.kubeconfig, job, "xid79@rank0", *ns),
                   f"not allowed to create FaultInjections in namespace {kcover_namespace}")
    assert requests(k8s_api, kcover_namespace) == []

    monkeypatch.setenv("KUBECONFIG", str(admin))
    for args in (("x" * (1 << 20), "xid79@rank0"), (job, "xid79@" + "r" * (1 << 20))):
        monkeypatch.setattr(sys, "argv", ["kcover", "inject", *args])
        with pytest.raises(SystemExit) as ended:
            cli_main.main()
        assert ended.value.code == 2
        err = capfd.readouterr().err
        assert err.count("\n") == 1 and "too long (1048" in err and len(err) < 500, err[:300]


def test_the_agent_refuses_an_old_request_and_feeds_a_fresh_line_to_its_kernel_path() -> None:
    from datetime import UTC, datetime, timedelta

    from kcover.k8s.agent.inject import InjectionDesk, InjectionRequest

    fed: list[bytes] = []
    desk = InjectionDesk(client.ApiClient(), "node-a", namespace="kcover-system")
    line = "NVRM: Xid (PCI:0000:3b:00): 79, pid=0, name=python, GPU has fallen off the bus."
    request = InjectionRequest("xid79", "Job", "ns", "job", "pod", "uid", "node-a", 0, line=line,
                               created=datetime.now(UTC) - timedelta(minutes=10))
    answer, faults = desk._answer(request, {}, lambda block, pods: fed.append(block) or 1)
    assert answer.phase == "Failed" and answer.message.startswith("expired") and fed == [] and faults == 0
    fresh = InjectionRequest(**{**request.__dict__, "created": datetime.now(UTC)})
    answer, faults = desk._answer(fresh, {}, lambda block, pods: fed.append(block) or 1)
    assert answer.phase == "Done" and answer.line == line and fed == [line.encode() + b"\n"] and faults == 1


@pytest.mark.parametrize(("node", "label"), [
    ("gpu-1", "gpu-1"), ("ip-10-0-0-1.ec2.internal", "ip-10-0-0-1.ec2.internal"),
    ("n" * 64, None), ("a.b." + "c" * 70, None),
], ids=["short", "dotted", "64", "long"])
def test_every_node_name_has_a_label_value(node: str, label: str | None) -> None:
    from kcover.k8s.agent.inject import node_label

    value = node_label(node)
    assert value == label if label else (len(value) <= 63 and value.startswith("sha256-"))


def test_a_request_round_trips_through_storage() -> None:
    from kcover.k8s.agent.inject import InjectionRequest

    request = InjectionRequest("crash", "Job", "ns", "job", "pod", "uid", "node-a", 3, order="crash@rank3#abc")
    body = request.for_storage("kcover-system")
    body["metadata"].update(name="inject-x", uid="u1", creationTimestamp="2026-12-01T10:00:00Z")
    back = InjectionRequest.from_storage(body)
    assert back is not None and back.order == "crash@rank3#abc" and back.rank == 3 and back.line is None
    assert back.name == "inject-x" and back.created is not None and back.created.year == 2026
    assert InjectionRequest.from_storage({"spec": {"kind": "crash"}}) is None
