"""An agent killed in the middle of a log flood resumes from its offsets: no duplicate reports."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

from kubernetes import client
from tests.k8s.conftest import Processes, indexed_job, wait_until

from kcover.testing import TestCluster

LINE = "[{i}.000] NVRM: Xid (PCI:0000:3b:00): 79, pid={i}, name=python, GPU has fallen off the bus."


def records(core: client.CoreV1Api, namespace: str, pod: str) -> list[dict[str, Any]]:
    text = (core.read_namespaced_pod(pod, namespace).metadata.annotations or {}).get("kcover.io/faults")
    return list(json.loads(text)) if text else []


def test_agent_killed_during_a_flood_reports_once_and_counts_everything(
        test_cluster: TestCluster, k8s_api: Any, test_namespace: str, gpu_nodes: list[str],
        kcover_processes: Processes, tmp_path: Path) -> None:
    core, batch = client.CoreV1Api(k8s_api), client.BatchV1Api(k8s_api)
    batch.create_namespaced_job(test_namespace, indexed_job("flood", test_namespace, 1))
    pod = wait_until(lambda: [p for p in core.list_namespaced_pod(test_namespace).items
                              if p.status.phase == "Running"], 30, "the pod Running")[0]
    args = ["agent", "--node", pod.spec.node_name, "--log-root", str(test_cluster.log_root), "--kmsg", "",
            "--state-dir", str(tmp_path / "state"), "--kubeconfig", str(test_cluster.kubeconfig),
            "--health-interval", "0"]
    first = kcover_processes.start(args, tmp_path / "agent-1.log")
    written = 0
    for batch_number in range(10):
        lines = [LINE.format(i=written + k) for k in range(500)]
        test_cluster.write_container_log(test_namespace, pod.metadata.name, "trainer", lines)
        written += len(lines)
        time.sleep(0.1)
        if batch_number == 4:
            wait_until(lambda: records(core, test_namespace, pod.metadata.name), 10, "the first record")
            first.send_signal(signal.SIGKILL)
            first.wait(timeout=10)
            kcover_processes.start(args, tmp_path / "agent-2.log")
    wait_until(lambda: (r := records(core, test_namespace, pod.metadata.name)) and r[0]["count"] >= written, 30,
               lambda: f"a count of {written}: {records(core, test_namespace, pod.metadata.name)}")
    found = records(core, test_namespace, pod.metadata.name)
    assert [r["rule"] for r in found] == ["xid.79.fallen-off-bus"]
    assert written <= found[0]["count"] <= written + 500  # at most one round read twice after SIGKILL
    events = [e for e in core.list_namespaced_event(test_namespace).items
              if e.reason == "KcoverFault" and e.involved_object.name == pod.metadata.name]
    assert len(events) == 1
