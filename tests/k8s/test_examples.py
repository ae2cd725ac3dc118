"""The example manifests in examples/kubernetes are accepted by the real API server and by kcover's checks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from kcover.k8s.operator.views import spec_problems

EXAMPLES = Path(__file__).parents[2] / "examples" / "kubernetes"


def test_the_training_job_example_is_valid_and_opted_in(k8s_api: Any, test_namespace: str) -> None:
    documents = list(yaml.safe_load_all((EXAMPLES / "training-job.yaml").read_text()))
    assert [d["kind"] for d in documents] == ["Service", "Job"]
    service, job = documents
    client.CoreV1Api(k8s_api).create_namespaced_service(test_namespace, service, dry_run="All")
    accepted = client.BatchV1Api(k8s_api).create_namespaced_job(test_namespace, job, dry_run="All")
    assert accepted.spec.pod_failure_policy.rules[0].action == "Ignore"
    assert job["metadata"]["labels"]["kcover.io/cascading-recovery"] == "true"
    assert spec_problems("Job", job["spec"]) == ()
    trainer = job["spec"]["template"]["spec"]["containers"][0]
    env = {item["name"]: item.get("value") for item in trainer["env"]}
    mounts = {item["mountPath"] for item in trainer["volumeMounts"]}
    assert env["KCOVER_SHARED_MEMORY"] in mounts and env["KCOVER_CHECKPOINT_DIR"].startswith("/ckpt/")
    preflight = job["spec"]["template"]["spec"]["initContainers"][0]
    gate = {item["name"]: item.get("value") for item in preflight["env"]}
    assert preflight["command"][:3] == ["kcover", "preflight", "--pairwise"]
    assert {"NODE_RANK", "NNODES", "MASTER_ADDR", "MASTER_PORT"} <= set(gate)  # what --pairwise needs
    assert gate["NNODES"] == str(job["spec"]["completions"])
    assert gate["MASTER_ADDR"].split(".") == [f"{job['metadata']['name']}-0", service["metadata"]["name"]]
    assert service["spec"]["publishNotReadyAddresses"] is True  # init containers run before readiness
