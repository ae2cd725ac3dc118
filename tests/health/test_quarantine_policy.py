"""The pure quarantine policy: every branch of decide_node() and the circuit breaker, as tables."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from kcover.health.quarantine.policy import (
    ANNOTATION_PASSES,
    ANNOTATION_QUARANTINED,
    ANNOTATION_SINCE,
    NodeAction,
    NodeView,
    QuarantinePolicy,
    breaker_allows,
    decide_node,
)

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
POLICY = QuarantinePolicy(release_after_passes=3, max_share=0.25, min_allowed=1, window_s=3600)


def quarantined(name: str, passes: int = 0, ago: float = 60.0) -> NodeView:
    since = (NOW - timedelta(seconds=ago)).isoformat()
    return NodeView(
        name,
        unschedulable=True,
        annotations={ANNOTATION_QUARANTINED: "gpu.ecc", ANNOTATION_SINCE: since, ANNOTATION_PASSES: str(passes)},
    )


def healthy_nodes(count: int) -> list[NodeView]:
    return [NodeView(f"n{i}") for i in range(count)]


@pytest.mark.parametrize(
    ("node", "healthy", "verdict", "passes"),
    [
        pytest.param(NodeView("a"), True, NodeAction.NONE, 0, id="healthy-stays"),
        pytest.param(NodeView("a"), False, NodeAction.QUARANTINE, 0, id="fail-quarantines"),
        pytest.param(NodeView("a", unschedulable=True), False, NodeAction.REFUSED_FOREIGN_CORDON, 0,
                     id="foreign-cordon"),
        pytest.param(NodeView("a", unschedulable=True), True, NodeAction.NONE, 0, id="foreign-cordon-pass-untouched"),
        pytest.param(quarantined("a", 0), True, NodeAction.KEEP, 1, id="first-pass-counts"),
        pytest.param(quarantined("a", 1), True, NodeAction.KEEP, 2, id="second-pass-counts"),
        pytest.param(quarantined("a", 2), True, NodeAction.RELEASE, 3, id="third-pass-releases"),
        pytest.param(quarantined("a", 2), False, NodeAction.KEEP, 0, id="fail-resets-count"),
    ],
)
def test_decide(node: NodeView, healthy: bool, verdict: NodeAction, passes: int) -> None:
    decision = decide_node(node, healthy, "gpu.ecc: 2 errors", [node, *healthy_nodes(7)], NOW, POLICY)
    assert decision.action is verdict
    assert decision.passes == passes


def test_disabled_policy_never_quarantines() -> None:
    decision = decide_node(NodeView("a"), False, "x", healthy_nodes(8), NOW, QuarantinePolicy(enabled=False))
    assert decision.action is NodeAction.DISABLED


@pytest.mark.parametrize(
    ("recent", "old", "total", "allowed"),
    [
        pytest.param(0, 0, 8, True, id="none-yet"),
        pytest.param(1, 0, 8, True, id="one-of-two-allowed"),
        pytest.param(2, 0, 8, False, id="share-reached"),
        pytest.param(1, 5, 8, True, id="old-quarantines-outside-window"),
        pytest.param(0, 0, 2, True, id="min-allowed-on-small-cluster"),
        pytest.param(1, 0, 2, False, id="small-cluster-one-only"),
    ],
)
def test_circuit_breaker(recent: int, old: int, total: int, allowed: bool) -> None:
    nodes = [quarantined(f"r{i}") for i in range(recent)] + [quarantined(f"o{i}", ago=7200) for i in range(old)]
    nodes += healthy_nodes(total - len(nodes))
    ok, why = breaker_allows(nodes, NOW, POLICY)
    assert ok is allowed, why


def test_breaker_refusal_is_a_decision() -> None:
    nodes = [quarantined("r0"), quarantined("r1"), *healthy_nodes(6)]
    decision = decide_node(nodes[-1], False, "storage.fsync: slow", nodes, NOW, POLICY)
    assert decision.action is NodeAction.REFUSED_BREAKER
    assert "circuit breaker" in decision.reason
