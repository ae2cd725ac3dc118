"""The agent reads ``kcover pod``'s reports: the pod's generation, a failed rank's exit, each generation afresh.

The real agent tails CRI log lines written as the kubelet writes them, on a KWOK
pod, and records what it read on the pod through the real API server; the
operator's view of that pod then holds the current generation's faults only.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from tests.k8s.conftest import Processes, indexed_job, wait_until

from kcover.k8s.operator.views import pod_view
from kcover.k8s.progress import closed_run
from kcover.podline import PodReport, PodState
from kcover.testing import TestCluster

XID = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python, GPU has fallen off the bus."
NCCL = ("[rank1]: torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, "
        "remote process exited or there was a network error, NCCL version 2.20.5")


def annotations(core: client.CoreV1Api, namespace: str, pod: str) -> dict[str, str]:
    return dict(core.read_namespaced_pod(pod, namespace).metadata.annotations or {})


def one_pod_with_its_agent(job: str, cluster: TestCluster, core: client.CoreV1Api, batch: client.BatchV1Api,
                           namespace: str, processes: Processes, tmp_path: Path) -> tuple[str, Callable[..., None]]:
    """A one-pod Indexed Job, Running on KWOK, with the real agent of its node; its name, and a writer of its
    container log lines."""
    batch.create_namespaced_job(namespace, indexed_job(job, namespace, 1))
    pod = wait_until(lambda: [p for p in core.list_namespaced_pod(namespace).items
                              if p.status.phase == "Running"], 30, "the pod Running")[0]
    name = pod.metadata.name
    processes.start(["agent", "--node", pod.spec.node_name, "--log-root", str(cluster.log_root), "--kmsg", "",
                     "--state-dir", str(tmp_path / "state"), "--kubeconfig", str(cluster.kubeconfig),
                     "--health-interval", "0"], tmp_path / "agent.log")

    def write(*lines: str) -> None:
        cluster.write_container_log(namespace, name, "trainer", list(lines))

    return name, write


def test_each_generation_is_recorded_afresh_and_the_operator_judges_the_current_one(
        test_cluster: TestCluster, k8s_api: Any, test_namespace: str, gpu_nodes: list[str],
        kcover_processes: Processes, tmp_path: Path) -> None:
    core, batch = client.CoreV1Api(k8s_api), client.BatchV1Api(k8s_api)
    name, write = one_pod_with_its_agent("gens", test_cluster, core, batch, test_namespace, kcover_processes,
                                         tmp_path)

    write(PodReport(0, PodState.RUNNING, reason="ranks 0 of 2, port 29500").line(), "step 1 loss 0.5",
          "step 30 loss 0.2", NCCL,
          PodReport(0, PodState.FAILED, rank=0, exit=-9, step=30).line())
    first = wait_until(lambda: (a := annotations(core, test_namespace, name)).get("kcover.io/pod-state")
                       and json.loads(a["kcover.io/pod-state"])["state"] == "failed" and a, 30, "the failed state")
    assert json.loads(first["kcover.io/pod-state"]) == {"generation": 0, "state": "failed", "in_place": True,
                                                        "step": 30}
    records = json.loads(first["kcover.io/faults"])
    assert {(r["rule"], r["generation"]) for r in records} >= {("host.sigkill", 0)}
    exit_record = next(r for r in records if r["rule"] == "host.sigkill")
    assert exit_record["line"] == "rank 0: worker exited with exit code 137 (killed by signal 9) in generation 0"
    assert exit_record["rank"] == 0 and exit_record["step"] == 30

    write(PodReport(1, PodState.RUNNING, reason="ranks 0 of 2, port 29501").line(), "step 31 loss 0.2", NCCL)
    later = wait_until(lambda: (a := annotations(core, test_namespace, name))
                       and json.loads(a["kcover.io/pod-state"])["generation"] == 1
                       and any(r.get("generation") == 1 for r in json.loads(a["kcover.io/faults"])) and a,
                       30, "generation 1 and its fault")
    records = json.loads(later["kcover.io/faults"])
    nccl = [r for r in records if "NCCL error" in r["line"]]
    assert sorted(r["generation"] for r in nccl) == [0, 1]  # the same line, a new fault in the new generation
    view = pod_view(core.api_client.sanitize_for_serialization(core.read_namespaced_pod(name, test_namespace)))
    assert view.status is not None and view.status.generation == 1
    assert [f.rule for f in view.faults] == [nccl[1]["rule"]]  # generation 0's exit is not judged again
    events = [e for e in core.list_namespaced_event(test_namespace).items
              if e.reason == "KcoverFault" and e.involved_object.name == name and "NCCL" in e.message]
    assert len(events) == 2

    write("kcover-pod: generation=0 state=stopped reason=a late line of an older generation",
          "kcover-pod: generation=x state=running", "kcover-pod: " + "y" * 100_000, XID)
    after = wait_until(lambda: (a := annotations(core, test_namespace, name))
                       and any("Xid" in r["line"] for r in json.loads(a["kcover.io/faults"])) and a, 30, "the Xid")
    assert json.loads(after["kcover.io/pod-state"]) == {"generation": 1, "state": "running", "in_place": True,
                                                        "step": 31}  # generation 1's own newest step


def test_each_run_records_its_first_step_and_newest_checkpoint_for_the_jobs_ettr(
        test_cluster: TestCluster, k8s_api: Any, test_namespace: str, gpu_nodes: list[str],
        kcover_processes: Processes, tmp_path: Path) -> None:
    """``kcover.io/progress``: the first step (``kcover pod``'s own time wins over the agent's reading time when
    earlier), the newest checkpoint (an older one, or an absurd time, changes nothing wrong), each generation
    afresh; the operator's view holds the current generation's progress only."""
    core, batch = client.CoreV1Api(k8s_api), client.BatchV1Api(k8s_api)
    name, write = one_pod_with_its_agent("runs", test_cluster, core, batch, test_namespace, kcover_processes,
                                         tmp_path)

    def progress(check: Any, what: str) -> dict[str, Any]:
        def read() -> dict[str, Any] | None:
            text = annotations(core, test_namespace, name).get("kcover.io/progress")
            found = json.loads(text) if text else None
            return found if found is not None and check(found) else None
        return wait_until(read, 30, what)

    began = time.time() - 100
    write(PodReport(0, PodState.RUNNING, reason="ranks 0 of 1").line(), "step 1 loss 0.5")
    seen = progress(lambda p: p.get("generation") == 0, "generation 0's first step")
    assert seen["first"] > began + 90 and "checkpoint" not in seen  # the agent's reading time, for now
    write(PodReport(0, PodState.RUNNING, step=1, at=began).line(),
          PodReport(0, PodState.RUNNING, checkpoint=20, at=began + 10).line(),
          PodReport(0, PodState.RUNNING, checkpoint=10, at=began + 20).line())
    seen = progress(lambda p: p.get("checkpoint") == 20, "the checkpoint of step 20")
    assert seen == {"first": round(began, 3), "generation": 0, "checkpoint": 20, "checkpoint_at": round(began + 10, 3)}
    write(PodReport(0, PodState.RUNNING, checkpoint=40, at=1e9).line())  # 2001: absurd, the agent's time instead
    seen = progress(lambda p: p.get("checkpoint") == 40, "the checkpoint of step 40")
    assert seen["checkpoint_at"] > began + 90
    view = pod_view(core.api_client.sanitize_for_serialization(core.read_namespaced_pod(name, test_namespace)))
    assert view.run is not None and closed_run([view.run]) == pytest.approx(seen["checkpoint_at"] - began, abs=0.01)

    write(PodReport(1, PodState.RUNNING, reason="ranks 0 of 1").line())
    wait_until(lambda: json.loads(annotations(core, test_namespace, name)["kcover.io/pod-state"])["generation"] == 1,
               30, "generation 1")
    view = pod_view(core.api_client.sanitize_for_serialization(core.read_namespaced_pod(name, test_namespace)))
    assert view.progress is not None and view.run is None  # generation 0's progress is not generation 1's
    write("resuming from step 40")  # a step-like line before the generation's first step
    seen = progress(lambda p: p.get("generation") == 1, "generation 1's first step")
    assert "checkpoint" not in seen and seen["first"] > began + 90
    said = round(seen["first"] + 5, 3)  # kcover pod says when the first step came: its time wins, later or not
    write(PodReport(1, PodState.RUNNING, step=41, at=said).line())
    progress(lambda p: p.get("first") == said, "kcover pod's time of generation 1's first step")
