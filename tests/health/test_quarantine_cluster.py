"""The quarantine actuator against the real test cluster (KWOK nodes, real apiserver).

Covers the lifecycle: a failing report cordons + taints + annotates the node and
sets KcoverHealthy=False; passes are counted in the annotation; after N passes
the node is released with only kcover's marks removed (a foreign taint stays);
a node someone else cordoned is never touched; the circuit breaker refuses.
"""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client as k8s

from kcover.health.model import CheckResult, HealthReport, Status
from kcover.health.quarantine.kube import KubeQuarantine
from kcover.health.quarantine.policy import ANNOTATION_PASSES, ANNOTATION_QUARANTINED, NodeAction, QuarantinePolicy
from kcover.testing import TestCluster

pytestmark = pytest.mark.timeout(120)

FAIL = HealthReport("x", (CheckResult("gpu.ecc", Status.FAIL, "GPU 3: 2 uncorrectable ECC errors", 2, "errors", 0),))
PASS = HealthReport("x", (CheckResult("gpu.ecc", Status.PASS, "no errors", 0, "errors", 0),))


@pytest.fixture
def node(test_cluster: TestCluster, k8s_api: Any) -> Any:
    """A fresh KWOK node for one test, deleted afterwards."""
    (name,) = test_cluster.create_nodes(1, prefix="kq-", gpus=8)
    yield name
    k8s.CoreV1Api(k8s_api).delete_node(name)


def _node(k8s_api: Any, name: str) -> Any:
    return k8s.CoreV1Api(k8s_api).read_node(name)


def _condition(node: Any) -> Any:
    return next((c for c in node.status.conditions or [] if c.type == "KcoverHealthy"), None)


def _taints(node: Any) -> list[tuple[str, str | None, str]]:
    """Taints, without the ones the node lifecycle controller manages (node.kubernetes.io/unschedulable)."""
    return [(t.key, t.value, t.effect) for t in node.spec.taints or [] if not t.key.startswith("node.kubernetes.io/")]


def test_fail_quarantines_and_passes_release(k8s_api: Any, node: str) -> None:
    core = k8s.CoreV1Api(k8s_api)
    core.patch_node(
        node, {"spec": {"taints": [{"key": "team.example/gpu-burnin", "value": "x", "effect": "NoSchedule"}]}}
    )
    actuator = KubeQuarantine(core, QuarantinePolicy(release_after_passes=2, max_share=1.0))

    assert actuator.observe(node, FAIL).action is NodeAction.QUARANTINE
    seen = _node(k8s_api, node)
    assert seen.spec.unschedulable is True
    assert ("kcover.io/quarantine", "gpu.ecc", "NoSchedule") in _taints(seen)
    assert ("team.example/gpu-burnin", "x", "NoSchedule") in _taints(seen)
    assert "ECC" in seen.metadata.annotations[ANNOTATION_QUARANTINED]
    condition = _condition(seen)
    assert (condition.status, condition.reason) == ("False", "ChecksFailed")
    assert "GPU 3" in condition.message
    assert any(c.type == "Ready" for c in seen.status.conditions), "the kubelet's conditions are kept"

    first = actuator.observe(node, PASS)
    assert (first.action, first.passes) == (NodeAction.KEEP, 1)
    assert _node(k8s_api, node).metadata.annotations[ANNOTATION_PASSES] == "1"
    assert actuator.observe(node, FAIL).passes == 0, "a failure resets the count"
    assert actuator.observe(node, PASS).action is NodeAction.KEEP
    assert actuator.observe(node, PASS).action is NodeAction.RELEASE

    released = _node(k8s_api, node)
    assert not released.spec.unschedulable
    assert _taints(released) == [("team.example/gpu-burnin", "x", "NoSchedule")]
    assert ANNOTATION_QUARANTINED not in (released.metadata.annotations or {})
    assert _condition(released).status == "True"


def test_foreign_cordon_is_never_touched(k8s_api: Any, node: str) -> None:
    core = k8s.CoreV1Api(k8s_api)
    core.patch_node(node, {"spec": {"unschedulable": True}})
    actuator = KubeQuarantine(core, QuarantinePolicy(max_share=1.0))
    assert actuator.observe(node, FAIL).action is NodeAction.REFUSED_FOREIGN_CORDON
    assert actuator.release(node).action is NodeAction.NONE
    seen = _node(k8s_api, node)
    assert seen.spec.unschedulable is True
    assert _taints(seen) == []
    assert _condition(seen).status == "False", "the condition still reports the failure"


def test_circuit_breaker_refuses_beyond_share(test_cluster: TestCluster, k8s_api: Any) -> None:
    core = k8s.CoreV1Api(k8s_api)
    names = test_cluster.create_nodes(2, prefix="kb-", gpus=8)
    try:
        total = len(core.list_node().items)
        actuator = KubeQuarantine(core, QuarantinePolicy(max_share=1 / total, min_allowed=1))
        assert actuator.observe(names[0], FAIL).action is NodeAction.QUARANTINE
        second = actuator.observe(names[1], FAIL)
        assert second.action is NodeAction.REFUSED_BREAKER, second.reason
        assert not _node(k8s_api, names[1]).spec.unschedulable
    finally:
        for name in names:
            core.delete_node(name)
