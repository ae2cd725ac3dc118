"""The agent's periodic health checks drive the node's quarantine on the real control plane."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from kubernetes import client
from tests.k8s.conftest import Processes, wait_until

from kcover.ports import free_port
from kcover.testing import TestCluster


def agent(processes: Processes, cluster: TestCluster, node: str, tmp_path: Path, config: Path, log: str,
          port: int) -> Any:
    return processes.start(["agent", "--node", node, "--log-root", str(cluster.log_root), "--kmsg", "",
                            "--state-dir", str(tmp_path / "state"), "--kubeconfig", str(cluster.kubeconfig),
                            "--health-interval", "0.5", "--health-config", str(config), "--release-after", "2",
                            "--metrics-port", str(port)], tmp_path / log)


def scrape(port: int) -> str:
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
            return str(response.read().decode())
    except OSError:
        return ""


def kcover_status(cluster: TestCluster, *flags: str) -> Any:
    done = subprocess.run([sys.executable, "-m", "kcover", "status", "--kubeconfig", str(cluster.kubeconfig),
                           *flags], capture_output=True, text=True, timeout=60, check=True,
                          env={**os.environ, "COLUMNS": "250"})
    return json.loads(done.stdout) if flags else done.stdout


def condition(core: client.CoreV1Api, node: str) -> str | None:
    for item in core.read_node(node).status.conditions or []:
        if item.type == "KcoverHealthy":
            return str(item.status)
    return None


def test_failed_check_quarantines_and_passing_runs_release(
        test_cluster: TestCluster, k8s_api: Any, gpu_nodes: list[str], kcover_processes: Processes,
        tmp_path: Path) -> None:
    core = client.CoreV1Api(k8s_api)
    node = gpu_nodes[0]
    failing = tmp_path / "failing.yaml"
    failing.write_text("suites: {quick: [storage.free]}\nstorage: {min_free_gb: 1000000, path: " + str(tmp_path)
                       + "}\n")
    port = free_port()
    first = agent(kcover_processes, test_cluster, node, tmp_path, failing, "agent-1.log", port)
    wait_until(lambda: core.read_node(node).spec.unschedulable, 30, "quarantine after a failed check")
    metrics = wait_until(lambda: scrape(port), 10, "metrics")
    assert f'kcover_health_check_status{{check="storage.free",node="{node}"}} 0.0' in metrics
    assert f'kcover_node_quarantined{{node="{node}"}} 1.0' in metrics
    assert condition(core, node) == "False"
    taints = [t.key for t in core.read_node(node).spec.taints or []]
    assert "kcover.io/quarantine" in taints
    assert not any(core.read_node(n).spec.unschedulable for n in gpu_nodes[1:])
    shown = kcover_status(test_cluster, "--json")
    assert shown["node_health"][node]["status"] == "fail"
    assert [(c["name"], c["status"]) for c in shown["node_health"][node]["checks"]] == [("storage.free", "fail")]
    assert node in shown["quarantined_nodes"]
    table = kcover_status(test_cluster)
    assert f"{node}" in table and "storage.free fail:" in table and "(quarantined)" in table
    first.send_signal(signal.SIGTERM)
    first.wait(timeout=10)
    passing = tmp_path / "passing.yaml"
    passing.write_text("suites: {quick: [storage.free]}\nstorage: {min_free_gb: 0, min_free_fraction: 0, path: "
                       + str(tmp_path) + "}\n")
    agent(kcover_processes, test_cluster, node, tmp_path, passing, "agent-2.log", free_port())
    wait_until(lambda: not core.read_node(node).spec.unschedulable, 30, "release after 2 passing runs")
    assert condition(core, node) == "True"
    assert "kcover.io/quarantine" not in [t.key for t in core.read_node(node).spec.taints or []]


def test_malformed_health_config_is_a_usage_error(test_cluster: TestCluster, tmp_path: Path) -> None:
    import subprocess
    import sys

    bad = tmp_path / "bad.yaml"
    bad.write_text("storage: {min_free_gb: plenty}\n")
    done = subprocess.run([sys.executable, "-m", "kcover", "agent", "--node", "x", "--kubeconfig",
                           str(test_cluster.kubeconfig), "--health-config", str(bad)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert "storage.min_free_gb" in done.stderr


def kcover_check_node(cluster: TestCluster, node: str, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kcover", "check", "--node", node, "--kubeconfig",
                           str(cluster.kubeconfig), *flags], capture_output=True, text=True, timeout=120, check=False,
                          env={**os.environ, "COLUMNS": "250"})


def request_annotation(core: client.CoreV1Api, node: str) -> str | None:
    return (core.read_node(node).metadata.annotations or {}).get("kcover.io/health-request")


def health_record(core: client.CoreV1Api, node: str, request: str) -> dict[str, Any] | None:
    record = json.loads((core.read_node(node).metadata.annotations or {}).get("kcover.io/health", "{}"))
    return record if record.get("request") == request else None


def test_check_node_runs_the_requested_suite_by_that_nodes_agent(
        test_cluster: TestCluster, k8s_api: Any, gpu_nodes: list[str], kcover_processes: Processes,
        tmp_path: Path) -> None:
    core = client.CoreV1Api(k8s_api)
    node, idle = gpu_nodes[0], gpu_nodes[1]
    suites = tmp_path / "suites.yaml"
    suites.write_text("suites: {quick: [storage.free], full: [storage.free, storage.fsync]}\n"
                      f"storage: {{min_free_gb: 0, min_free_fraction: 0, path: {tmp_path}}}\n")
    kcover_processes.start(["agent", "--node", node, "--log-root", str(test_cluster.log_root), "--kmsg", "",
                            "--state-dir", str(tmp_path / "state"), "--kubeconfig", str(test_cluster.kubeconfig),
                            "--health-interval", "0", "--health-config", str(suites)], tmp_path / "agent.log")
    full = kcover_check_node(test_cluster, node, "--suite", "full", "--json", "--timeout", "60")
    assert full.returncode == 0, full.stderr
    answer = json.loads(full.stdout)
    assert (answer["node"], answer["suite"]) == (node, "full")
    assert [(c["name"], c["status"]) for c in answer["checks"]] == [("storage.free", "pass"), ("storage.fsync", "pass")]
    assert answer["checks"][1]["unit"] == "ms" and answer["checks"][1]["threshold"] == 50
    wait_until(lambda: request_annotation(core, node) is None, 10, "the answered request withdrawn")
    assert condition(core, node) == "True"  # a requested run goes through the same quarantine path

    table = kcover_check_node(test_cluster, node, "--timeout", "60")  # the quick suite, as a table
    assert table.returncode == 0, table.stderr
    assert "storage.free" in table.stdout and "storage.fsync" not in table.stdout and "1 pass" in table.stdout

    # A suite the agent does not know (its configuration differs from this client's): answered as an error
    core.patch_node(node, {"metadata": {"annotations": {"kcover.io/health-request": "nightly/abc123"}}})
    record = wait_until(lambda: health_record(core, node, "abc123"), 20, "the agent's answer")
    assert "unknown health suite 'nightly'" in record["error"] and record["usage_error"] is True
    assert [c["name"] for c in record["checks"]] == ["storage.free"]  # the last run stays for `kcover status`
    wait_until(lambda: request_annotation(core, node) is None, 10, "the refused request withdrawn")

    unanswered = kcover_check_node(test_cluster, idle, "--timeout", "1.5")  # no agent runs there
    assert unanswered.returncode == 1
    assert f"no answer from the kcover agent on node {idle} within 1.5 s" in unanswered.stderr
    assert request_annotation(core, idle) is None  # withdrawn: an agent started later does not run it
    missing = kcover_check_node(test_cluster, "no-such-node", "--timeout", "1")
    assert missing.returncode == 2 and "no node named 'no-such-node'" in missing.stderr
    mixed = kcover_check_node(test_cluster, node, "--only", "storage")
    assert mixed.returncode == 2 and "--only" in mixed.stderr and "Traceback" not in mixed.stderr
