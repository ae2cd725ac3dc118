"""``kcover report --job NS/NAME``: the page of a Kubernetes job, read back from the real test API server.

The job's history is written the way kcover writes it: the node agent's
:class:`~kcover.k8s.agent.report.KubeReporter` posts the ``KcoverFault`` Events,
the operator's :class:`~kcover.k8s.operator.actuate.Actuator` claims the restart
(the ``kcover.io/recovery`` record), posts ``KcoverRestart`` and keeps the
evidence ConfigMap.  Only the pods are made by hand (on KWOK nodes, as the Job
controller would), so which attempt ran where is known exactly.  Then the real
CLI writes the page and the test reads it as a person would: a lane per node,
the fault marks, the verdict, the restart count.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from tests.runreport.conftest import kcover

from kcover.classify.attribution import attribute
from kcover.classify.collector import fault_from_rule
from kcover.classify.matcher import Matcher
from kcover.decide.policy import PastFailure, RecoveryState
from kcover.faults import Evidence, Fault
from kcover.health.quarantine.kube import KubeQuarantine
from kcover.k8s.agent.pods import PodInfo
from kcover.k8s.agent.report import KubeReporter
from kcover.k8s.kinds import BATCH_JOB
from kcover.k8s.names import OPT_IN_LABEL, OPT_IN_VALUE, RECOVERY, STATE
from kcover.k8s.operator.actuate import Actuator
from kcover.k8s.operator.record import RecoveryRecord, RestartMethod
from kcover.k8s.operator.views import job_view, pod_view
from kcover.runreport.kube import NOT_RECORDED, load_job
from kcover.testing import TestCluster
from kcover.testing._rest import ApiError

XID = "NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python, GPU has fallen off the bus."
REMOTE = ("[rank1]: torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, "
          "remote process exited or there was a network error, NCCL version 2.20.5")
OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
DECISION = "restart 1/3 in 0s: gpu_hardware on the node, excluding it"
MARK = re.compile(r'<g class="fault ([a-z ]+)" data-category="([^"]*)" data-rule="([^"]*)">.*?<title>(.*?)</title>',
                  re.DOTALL)


# -- what the Job controller, the agent and the operator would have written ------------------------------------
def job_body(name: str, namespace: str, opted_in: bool = True, annotations: dict[str, str] | None = None
             ) -> dict[str, Any]:
    """A suspended batch Job (its controller starts no pods: the test places them)."""
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "namespace": namespace, "annotations": annotations or {},
                         "labels": {OPT_IN_LABEL: OPT_IN_VALUE} if opted_in else {}},
            "spec": {"suspend": True, "completions": 2, "parallelism": 2, "completionMode": "Indexed",
                     "template": {"spec": {"restartPolicy": "Never",
                                           "containers": [{"name": "trainer", "image": "trainer:v1"}]}}}}


def create_job(cluster: TestCluster, body: dict[str, Any]) -> dict[str, Any]:
    return cluster.api.post(f"/apis/batch/v1/namespaces/{body['metadata']['namespace']}/jobs", body)


def create_pod(cluster: TestCluster, namespace: str, job: str, name: str, node: str, index: int) -> dict[str, Any]:
    body = {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": {BATCH_JOB.pod_label: job},
                         "annotations": {"batch.kubernetes.io/job-completion-index": str(index)}},
            "spec": {"nodeName": node, "restartPolicy": "Never",
                     "containers": [{"name": "trainer", "image": "trainer:v1"}]}}
    return cluster.api.post(f"/api/v1/namespaces/{namespace}/pods", body)


def fault(line: str, pod: str, node: str) -> Fault:
    rule = Matcher.default().classify_text(line)
    assert rule is not None, line
    return fault_from_rule(rule, Evidence(source=pod, line=line, node=node))


def report_fault(api: Any, reporter_node: str, pod: dict[str, Any], job: str, found: Fault) -> None:
    """What the agent on ``reporter_node`` does with a new fault: an Event now, the pod's record on flush."""
    meta = pod["metadata"]
    info = PodInfo(meta["namespace"], meta["name"], meta["uid"], pod["spec"]["nodeName"], BATCH_JOB, job,
                   int(meta["annotations"]["batch.kubernetes.io/job-completion-index"]))
    reporter = KubeReporter(api, reporter_node)
    reporter.new_fault(info, found)
    reporter.flush(force=True)


def read_job(cluster: TestCluster, namespace: str, name: str) -> dict[str, Any]:
    return cluster.api.get(f"/apis/batch/v1/namespaces/{namespace}/jobs/{name}")


@pytest.fixture
def report_nodes(test_cluster: TestCluster) -> Iterator[list[str]]:
    """Three KWOK nodes of this test's own."""
    names = test_cluster.create_nodes(3, prefix=f"rpt-{uuid.uuid4().hex[:5]}-")
    yield names
    for name in names:
        with contextlib.suppress(ApiError):
            test_cluster.api.delete(f"/api/v1/nodes/{name}")


@pytest.fixture
def recovered(test_cluster: TestCluster, k8s_api: Any, test_namespace: str, report_nodes: list[str]
              ) -> dict[str, Any]:
    """Job ``train``: attempt 1 on nodes 0 and 1 hit an Xid on node 0 (node 1 saw the cascade); the operator
    restarted it excluding node 0; attempt 2 runs on nodes 2 and 1 and has logged a CUDA OOM on node 2."""
    ns, (n0, n1, n2) = test_namespace, report_nodes
    create_job(test_cluster, job_body("train", ns))
    first = [create_pod(test_cluster, ns, "train", "train-0-aaaaa", n0, 0),
             create_pod(test_cluster, ns, "train", "train-1-bbbbb", n1, 1)]
    xid, cascade = fault(XID, "train-0-aaaaa", n0), fault(REMOTE, "train-1-bbbbb", n1)
    report_fault(k8s_api, n0, first[0], "train", xid)
    report_fault(k8s_api, n1, first[1], "train", cascade)
    time.sleep(1.1)  # Events carry whole seconds: the restart comes after the faults

    verdict = attribute([xid, cascade])
    assert verdict.rule == xid.rule and verdict.nodes == (n0,)
    state = RecoveryState(restarts=1, failures=(PastFailure(verdict.category, verdict.rule, None),),
                          excluded=verdict.nodes)
    record = RecoveryRecord().claimed(state, verdict, DECISION, dt.datetime.now(dt.UTC), 0.0,
                                      replaced=[p["metadata"]["uid"] for p in first],
                                      failing=["train-0-aaaaa", "train-1-bbbbb"], quarantine=verdict.nodes,
                                      method=RestartMethod.NATIVE)
    actuator = Actuator(k8s_api, KubeQuarantine(client.CoreV1Api(k8s_api)))
    view = job_view("Job", read_job(test_cluster, ns, "train"))
    actuator.claim(view, record, DECISION)
    actuator.event(view, "KcoverRestart", f"restarting: {DECISION}", warning=True)
    actuator.event(view, "KcoverRestart", f"restarting: {DECISION}", warning=True)  # a new leader's replay
    pods = [pod_view(test_cluster.api.get(f"/api/v1/namespaces/{ns}/pods/{p['metadata']['name']}"))
            for p in first]
    actuator.keep_evidence(view, record, pods)
    actuator.patch_job(view, {"metadata": {"annotations": {RECOVERY: record.completed().to_annotation(),
                                                           STATE: "running"}}})
    for pod in first:
        test_cluster.api.delete(f"/api/v1/namespaces/{ns}/pods/{pod['metadata']['name']}?gracePeriodSeconds=0")
    time.sleep(1.1)

    second = [create_pod(test_cluster, ns, "train", "train-0-ccccc", n2, 0),
              create_pod(test_cluster, ns, "train", "train-1-ddddd", n1, 1)]
    # reported by an agent that names another host: a pod that still exists is placed on its own node
    report_fault(k8s_api, "somewhere-else", second[0], "train", fault(OOM, "train-0-ccccc", n2))
    return {"nodes": report_nodes, "xid": xid, "cascade": cascade}


def marks(page: str) -> list[tuple[str, str, str, str]]:
    return MARK.findall(page)


def one_clean_line(done: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr[-3000:]
    assert lines[0].startswith("kcover: ")
    return lines[0]


# -- the page of a recovered job -------------------------------------------------------------------------------
def test_the_page_shows_where_what_failed_and_how_it_was_recovered(
        test_cluster: TestCluster, test_namespace: str, recovered: dict[str, Any], tmp_path: Path) -> None:
    n0, n1, n2 = recovered["nodes"]
    target = tmp_path / "job.html"
    done = kcover("report", "--job", f"{test_namespace}/train", "-o", str(target),
                  "--kubeconfig", str(test_cluster.kubeconfig))
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == str(target)
    page = target.read_text()

    assert f"kcover report: Job {test_namespace}/train" in page
    assert re.search(r'<b id="restarts">1</b>', page)
    assert page.count(NOT_RECORDED) == 1  # said once, and nothing shown as zero instead
    assert 'id="ettr"' not in page and "Step progress" not in page and 'id="lost-table"' not in page
    # a lane per node, the excluded one marked
    for lane in (f"{n0} (excluded)", n1, n2):
        assert f'data-lane="{lane}"' in page
    # the faults as marks: the Xid as the root cause, the NCCL error as its cascade, the OOM on its pod's node
    found = {rule: (kind, title) for kind, _, rule, title in marks(page)}
    assert found["xid.79.fallen-off-bus"][0] == "root"
    assert n0 in found["xid.79.fallen-off-bus"][1] and "attempt 1" in found["xid.79.fallen-off-bus"][1]
    assert found["nccl.remote-error"][0] == "cascade" and n1 in found["nccl.remote-error"][1]
    assert n2 in found["cuda.oom"][1] and "somewhere-else" not in found["cuda.oom"][1]
    assert "attempt 2" in found["cuda.oom"][1]
    # the verdict of the failure, its remediation and the evidence the operator kept
    failure = page[page.index('<div class="failure" data-attempt="1">'):]
    assert "gpu_hardware" in failure and "<code>xid.79.fallen-off-bus</code>" in failure
    assert f"blamed nodes: {n0}" in failure and DECISION in failure
    assert f"<b>Remediation:</b> {recovered['xid'].remediation[:40]}" in failure
    assert "kept by the operator from pod <code>train-0-aaaaa</code>" in failure
    assert 'data-attempt="2"' not in page.split("<h2>Failures")[1]  # attempt 2 is still running


def test_the_model_has_one_attempt_per_restart_on_the_nodes_it_ran_on(
        k8s_api: Any, test_namespace: str, recovered: dict[str, Any]) -> None:
    n0, n1, n2 = recovered["nodes"]
    run = load_job(k8s_api, test_namespace, "train")
    assert [(a.number, a.outcome) for a in run.attempts] == [(1, "failed"), (2, "running")]  # replay counted once
    assert set(run.attempts[0].nodes) == {n0, n1} and set(run.attempts[1].nodes) == {n1, n2}
    assert run.attempts[0].ended == run.attempts[1].started
    assert run.attempts[0].verdict["rule"] == "xid.79.fallen-off-bus"
    assert run.excluded == (n0,) and run.restarts == 1 and run.status == "running"
    assert [(f.rule, f.attempt, f.node) for f in run.faults] == [
        ("xid.79.fallen-off-bus", 1, n0), ("nccl.remote-error", 1, n1), ("cuda.oom", 2, n2)]


def test_a_job_failed_fast_shows_its_one_failed_attempt(test_cluster: TestCluster, k8s_api: Any,
                                                       test_namespace: str, report_nodes: list[str]) -> None:
    create_job(test_cluster, job_body("buggy", test_namespace))
    pod = create_pod(test_cluster, test_namespace, "buggy", "buggy-0-aaaaa", report_nodes[0], 0)
    error = fault("KeyError: 'labels'", "buggy-0-aaaaa", report_nodes[0])
    report_fault(k8s_api, report_nodes[0], pod, "buggy", error)
    verdict = attribute([error])
    state = RecoveryState(failures=(PastFailure(verdict.category, verdict.rule, None),))
    reason = "fail: deterministic user error, retrying would fail again"
    view = job_view("Job", read_job(test_cluster, test_namespace, "buggy"))
    Actuator(k8s_api, KubeQuarantine(client.CoreV1Api(k8s_api))).fail(
        view, RecoveryRecord().failed(state, verdict, reason), reason)
    run = load_job(k8s_api, test_namespace, "buggy")
    assert run.status == "failed" and run.restarts == 0
    assert [(a.number, a.outcome, a.verdict["rule"], a.decision) for a in run.attempts] == [
        (1, "failed", "python.exception", reason)]
    assert [(f.rule, f.attempt, f.node) for f in run.faults] == [("python.exception", 1, report_nodes[0])]


def test_the_default_target_is_named_after_the_job(test_cluster: TestCluster, test_namespace: str,
                                                   tmp_path: Path) -> None:
    create_job(test_cluster, job_body("quiet", test_namespace))
    done = kcover("report", "--job", f"{test_namespace}/quiet", "--kubeconfig", str(test_cluster.kubeconfig),
                  cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    page = (tmp_path / f"report-{test_namespace}-quiet.html").read_text()
    assert "No attempt failed." in page and '<b id="restarts">0</b>' in page


def test_a_mebibyte_job_name_is_one_short_line(tmp_path: Path) -> None:
    # an argument that long exceeds what exec passes (128 KiB), so the real CLI reads argv from stdin here
    program = ("import sys; sys.argv = ['kcover', 'report', '--job', sys.stdin.read()]; "
               "from kcover.cli.main import main; main()")
    done = subprocess.run([sys.executable, "-c", program], input="ns/" + "x" * (1 << 20), capture_output=True,
                          text=True, timeout=60, check=False, cwd=tmp_path)
    assert done.returncode == 2
    assert len(one_clean_line(done)) < 400
    assert list(tmp_path.iterdir()) == []


def test_a_job_that_does_not_exist_is_a_usage_error(test_cluster: TestCluster, test_namespace: str,
                                                    tmp_path: Path) -> None:
    done = kcover("report", "--job", f"{test_namespace}/nope", "--kubeconfig", str(test_cluster.kubeconfig),
                  cwd=tmp_path)
    assert done.returncode == 2
    assert f"{test_namespace}/nope: no such job" in one_clean_line(done)
    assert list(tmp_path.iterdir()) == []


def test_a_job_not_opted_in_is_a_usage_error(test_cluster: TestCluster, test_namespace: str,
                                             tmp_path: Path) -> None:
    create_job(test_cluster, job_body("plain", test_namespace, opted_in=False))
    done = kcover("report", "--job", f"{test_namespace}/plain", "--kubeconfig", str(test_cluster.kubeconfig),
                  cwd=tmp_path)
    assert done.returncode == 2
    assert "not opted in" in one_clean_line(done)
    assert list(tmp_path.iterdir()) == []


def test_an_unreachable_cluster_is_one_line_and_exit_1(tmp_path: Path) -> None:
    config = tmp_path / "kubeconfig"
    config.write_text("apiVersion: v1\nkind: Config\ncurrent-context: c\nclusters: [{name: c, cluster: "
                      "{server: 'https://127.0.0.1:1', insecure-skip-tls-verify: true}}]\n"
                      "contexts: [{name: c, context: {cluster: c, user: u}}]\nusers: [{name: u, user: {token: t}}]\n")
    done = kcover("report", "--job", "ns/train", "--kubeconfig", str(config), "-o", str(tmp_path / "r.html"),
                  timeout=120)
    assert done.returncode == 1
    assert "cannot reach the Kubernetes API server at https://127.0.0.1:1" in one_clean_line(done)
    assert not (tmp_path / "r.html").exists()


def test_a_garbage_recovery_record_still_renders_and_says_so(test_cluster: TestCluster, test_namespace: str,
                                                             tmp_path: Path) -> None:
    create_job(test_cluster, job_body("mangled", test_namespace, annotations={RECOVERY: '{"attempt": [1, {"'}))
    target = tmp_path / "r.html"
    done = kcover("report", "--job", f"{test_namespace}/mangled", "-o", str(target),
                  "--kubeconfig", str(test_cluster.kubeconfig))
    assert done.returncode == 0, done.stderr[-3000:]
    page = target.read_text()
    assert f"The recovery record ({RECOVERY}) on the job could not be read" in page
    assert '<b id="restarts">0</b>' in page


def test_five_thousand_events_stay_bounded(test_cluster: TestCluster, test_namespace: str, tmp_path: Path) -> None:
    """4,000 faults from 80 hosts on pods long gone and 1,000 restarts: the page stays small and complete."""
    body = create_job(test_cluster, job_body("flood", test_namespace))
    start = dt.datetime.now(dt.UTC) - dt.timedelta(hours=2)

    def stamp(seconds: float) -> str:
        return (start + dt.timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")

    def event(index: int) -> None:
        restart = index < 1000
        kind, name = ("Job", "flood") if restart else ("Pod", f"flood-{index % 8}-gone{index % 7}")
        at = stamp(index * 6 + 3 if restart else (index - 1000) * 1.5)
        test_cluster.api.post(f"/api/v1/namespaces/{test_namespace}/events", {
            "metadata": {"generateName": f"{name}.kcover-", "namespace": test_namespace},
            "involvedObject": {"kind": kind, "name": name, "namespace": test_namespace,
                               "uid": body["metadata"]["uid"] if restart else ""},
            "reason": "KcoverRestart" if restart else "KcoverFault",
            "message": f"restarting: restart {index + 1}/1000 in 0s: <b>x</b>" if restart
            else f"gpu_hardware (xid.79.fallen-off-bus): {XID} <script>{index}</script>",
            "type": "Warning", "source": {"component": "kcover-operator" if restart else "kcover-agent",
                                          "host": "" if restart else f"host-{index % 80}"},
            "firstTimestamp": at, "lastTimestamp": at, "count": 1})

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(event, range(5000)))
    target = tmp_path / "r.html"
    began = time.monotonic()
    done = kcover("report", "--job", f"{test_namespace}/flood", "-o", str(target),
                  "--kubeconfig", str(test_cluster.kubeconfig))
    assert done.returncode == 0, done.stderr[-3000:]
    assert time.monotonic() - began < 60
    page = target.read_text()
    assert len(page.encode()) < 5_000_000
    assert "<script>" not in page
    assert "<b>1,001</b>" in page or "<b>1001</b>" in page  # attempts
    assert '<b id="restarts">1000</b>' in page
    assert "4,000 faults: more than 2,000, so each failure" in page
    assert "16 nodes with the fewest faults are not drawn" in page
