"""A straggler across pods with the real agents, the real operator and ``kcover status``.

Four pods of an Indexed Job each log what ``kcover pod`` logs for its rank —
its generation, then its compute seconds in batches of 16 steps, paced as a
training job would — and rank 3 becomes 1.5× slower at step 100.  The
agents record each pod's newest step times on the pod; the operator, which
alone sees every pod, must flag rank 3 and no other: one ``KcoverStraggler``
Event on the job, ``kcover.io/stragglers`` on it (shown by ``kcover status``),
and ``kcover_straggler_slowdown`` for rank 3 on its node.
"""

from __future__ import annotations

import json
import random
import re
import time
from pathlib import Path
from typing import Any

from kubernetes import client
from tests.k8s.conftest import Processes, indexed_job, metric_samples, wait_until
from tests.k8s.test_agent_health import kcover_status, scrape

from kcover.k8s.operator.stragglers import decode
from kcover.podline import PodReport, PodState, PodTimings
from kcover.ports import free_port
from kcover.testing import TestCluster

RANKS, SLOW, FROM, BATCH = 4, 3, 100, 16


def play(test_cluster: TestCluster, k8s_api: Any, namespace: str, processes: Processes, tmp_path: Path, ranks: int,
         annotations: dict[str, str] | None = None) -> tuple[dict[int, Any], int, Any]:
    """Start the job, the operator and an agent per node, log until the straggler is flagged; returns the pods by
    rank, the metrics port and the ``KcoverStraggler`` Event."""
    core, batch = client.CoreV1Api(k8s_api), client.BatchV1Api(k8s_api)
    body = indexed_job("slow", namespace, ranks)
    body["metadata"]["annotations"] = annotations or {}
    batch.create_namespaced_job(namespace, body)
    pods = wait_until(lambda: (found := [p for p in core.list_namespaced_pod(namespace).items
                                         if p.status.phase == "Running"]) and len(found) == ranks and found,
                      30, "the pods Running")
    by_rank = {int(p.metadata.annotations["batch.kubernetes.io/job-completion-index"]): p for p in pods}
    port = free_port()
    config = str(test_cluster.kubeconfig)
    processes.start(["operator", "--kubeconfig", config, "--namespace", namespace, "--lease-seconds", "3",
                     "--metrics-port", str(port)], tmp_path / "operator.log")
    for node in sorted({p.spec.node_name for p in pods}):
        processes.start(["agent", "--node", node, "--log-root", str(test_cluster.log_root), "--kmsg", "",
                         "--state-dir", str(tmp_path / "agent"), "--kubeconfig", config, "--health-interval", "0"],
                        tmp_path / f"agent-{node}.log")

    def write(rank: int, *lines: str) -> None:
        test_cluster.write_container_log(namespace, by_rank[rank].metadata.name, "trainer", list(lines))

    for rank in range(ranks):
        write(rank, PodReport(0, PodState.RUNNING, reason=f"ranks {rank} of {ranks}").line())
    rng = random.Random(5)
    flagged: list[Any] = []
    for first in range(0, 400, BATCH):
        for rank in range(ranks):
            seconds = tuple(0.2 * rng.lognormvariate(0, 0.03) * (1.5 if rank == SLOW and step >= FROM else 1.0)
                            for step in range(first, first + BATCH))
            write(rank, PodTimings(0, rank, first, seconds).line(), f"step {first + BATCH - 1} loss 0.1")
        time.sleep(1.3)  # the agents write each pod at most once a second
        flagged = [e for e in core.list_namespaced_event(namespace).items if e.reason == "KcoverStraggler"]
        if flagged:
            break
    assert len(flagged) == 1, (tmp_path / "operator.log").read_text()[-3000:]
    event = flagged[0]
    node = by_rank[SLOW].spec.node_name
    assert event.involved_object.kind == "Job" and event.involved_object.name == "slow"
    assert event.message.startswith(f"rank {SLOW} (pod {by_rank[SLOW].metadata.name} on node {node}) is a straggler")
    slow = float(re.search(r"computes ([\d.]+)x", event.message).group(1))  # type: ignore[union-attr]
    assert 1.3 < slow < 1.7
    return by_rank, port, event


def test_the_operator_flags_the_slow_rank_of_a_job_across_pods(
        test_cluster: TestCluster, k8s_api: Any, test_namespace: str, gpu_nodes: list[str],
        kcover_processes: Processes, tmp_path: Path) -> None:
    batch = client.BatchV1Api(k8s_api)
    by_rank, port, event = play(test_cluster, k8s_api, test_namespace, kcover_processes, tmp_path, RANKS)
    node = by_rank[SLOW].spec.node_name
    assert "replac" not in event.message  # the default action reports only
    recorded = wait_until(lambda: decode((batch.read_namespaced_job("slow", test_namespace).metadata.annotations
                                          or {}).get("kcover.io/stragglers")), 30, "the job's record")
    assert [(s["rank"], s["node"]) for s in recorded] == [(SLOW, node)]
    status = kcover_status(test_cluster, "--json")
    job = next(j for j in status["jobs"] if j["namespace"] == test_namespace and j["name"] == "slow")
    assert [(s["rank"], s["node"]) for s in job["stragglers"]] == [(SLOW, node)]
    samples = [(labels, value) for labels, value in metric_samples(scrape(port), "kcover_straggler_slowdown")
               if labels.get("namespace") == test_namespace]
    assert [labels for labels, _ in samples] == [{"namespace": test_namespace, "job": "slow", "node": node,
                                                  "rank": str(SLOW)}]
    assert 1.3 < samples[0][1] < 1.7


def test_replace_restarts_the_job_without_the_slow_node_on_a_spare_one(
        test_cluster: TestCluster, k8s_api: Any, test_namespace: str, gpu_nodes: list[str],
        kcover_processes: Processes, tmp_path: Path) -> None:
    """Three pods on the four nodes this test owns: at least one spare node, found through the pods'
    ``nodeSelector``; a long job left to run: replacing the slow node pays."""
    core, batch = client.CoreV1Api(k8s_api), client.BatchV1Api(k8s_api)
    by_rank, _, event = play(test_cluster, k8s_api, test_namespace, kcover_processes, tmp_path, SLOW + 1,
                             {"kcover.io/straggler-action": "replace", "kcover.io/total-steps": "1000000"})
    node = by_rank[SLOW].spec.node_name
    assert "; replacing its node: gain " in event.message, event.message
    quarantined = wait_until(lambda: "kcover.io/quarantined" in (core.read_node(node).metadata.annotations or {}),
                             30, "the slow node quarantined")
    assert quarantined and core.read_node(node).spec.unschedulable
    record = wait_until(lambda: (found := json.loads((batch.read_namespaced_job("slow", test_namespace).metadata
                                                      .annotations or {}).get("kcover.io/recovery", "{}")))
                        and found.get("attempt", 1) > 1 and found, 30, "the restart claimed")
    assert record["last"]["rule"] == "job.straggler" and record["last"]["nodes"] == [node]
    assert [n for n in gpu_nodes if n not in {p.spec.node_name for p in by_rank.values()}]  # the spare
