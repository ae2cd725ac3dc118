"""Fixtures for the Kubernetes end-to-end tests: nodes, the operator and the agents as real processes."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from kcover.testing import TestCluster


def wait_until(probe: Callable[[], Any], timeout: float = 30.0, what: str | Callable[[], str] = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what() if callable(what) else what}")


@dataclass
class Processes:
    """kcover processes started by a test, stopped (and checked) at its end."""

    started: list[subprocess.Popen[bytes]] = field(default_factory=list)
    logs: list[Any] = field(default_factory=list)

    def start(self, args: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        handle = log.open("wb")
        self.logs.append(handle)
        process = subprocess.Popen([sys.executable, "-m", "kcover", *args], stdout=handle, stderr=subprocess.STDOUT,
                                   env={**os.environ, **(env or {})})
        self.started.append(process)
        return process

    def stop_all(self) -> None:
        for process in self.started:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.started:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for handle in self.logs:
            handle.close()


@pytest.fixture
def kcover_processes() -> Iterator[Processes]:
    processes = Processes()
    yield processes
    processes.stop_all()


@pytest.fixture
def gpu_nodes(test_cluster: TestCluster, test_namespace: str, k8s_api: Any) -> Iterator[list[str]]:
    """Four fresh KWOK GPU nodes reserved for this test (label ``kcover-test=<namespace>``)."""
    prefix = f"gpu-{uuid.uuid4().hex[:5]}-"
    names = test_cluster.create_nodes(4, prefix=prefix, gpus=8, labels={"kcover-test": test_namespace})
    yield names
    core = client.CoreV1Api(k8s_api)
    for name in names:
        with contextlib.suppress(client.exceptions.ApiException):
            core.delete_node(name)


def indexed_job(name: str, namespace: str, pods: int, opted_in: bool = True, gpus: int = 2) -> dict[str, Any]:
    labels = {"kcover.io/cascading-recovery": "true"} if opted_in else {}
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "completions": pods, "parallelism": pods, "completionMode": "Indexed", "backoffLimit": 50,
            # kcover owns the retry decision: without this the Job controller backs off 10 s, 20 s, 40 s…
            # per failed pod before recreating anything (see the README, "Opting a job in").
            "podFailurePolicy": {"rules": [{"action": "Ignore",
                                            "onExitCodes": {"operator": "NotIn", "values": [0]}}]},
            "template": {"spec": {
                "restartPolicy": "Never", "nodeSelector": {"kcover-test": namespace},
                "containers": [{"name": "trainer", "image": "trainer:v1",
                                "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}],
            }},
        },
    }


def metric_samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """Each sample of metric ``name`` in a Prometheus scrape: its labels (in any order) and its value."""
    found = []
    for labels, value in re.findall(rf"^{name}\{{(.*)\}} (\S+)$", text, re.MULTILINE):
        found.append((dict(re.findall(r'(\w+)="([^"]*)"', labels)), float(value)))
    return found
