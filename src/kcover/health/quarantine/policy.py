"""The pure quarantine policy: from a node's health and marks to one decision.

No I/O and no clock reads: the caller passes ``now`` and the nodes as
:class:`NodeView` values (our type, not a Kubernetes model), so every branch is
tested as a table.  The lifecycle of a node, as kcover sees it::

    healthy ──fail──▶ quarantined (cordoned + tainted + annotated by kcover)
       ▲                  │ pass: passes += 1 ; fail: passes = 0
       └── N passes ──────┘

Rules: kcover never touches a node someone else cordoned (no kcover
annotation) and releases only nodes it quarantined; the circuit breaker
refuses a quarantine when more than ``max_share`` of the nodes (at least
``min_allowed``) were quarantined by kcover within ``window_s`` — a bad check
or a bad threshold must not drain a cluster.  The consecutive-pass count lives
in a node annotation, so an agent restart loses nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from kcover.timestamps import parse_rfc3339

ANNOTATION_QUARANTINED = "kcover.io/quarantined"  # value: the reason; presence = kcover did it
ANNOTATION_SINCE = "kcover.io/quarantined-at"  # RFC 3339, for the circuit breaker
ANNOTATION_PASSES = "kcover.io/health-passes"  # consecutive passing runs while quarantined
ANNOTATION_HEALTH = "kcover.io/health"  # JSON: the agent's last health run, every check (``kcover status``)
ANNOTATION_HEALTH_REQUEST = "kcover.io/health-request"  # "<suite>/<id>": run this suite now (``kcover check --node``)
TAINT_KEY = "kcover.io/quarantine"
CONDITION_TYPE = "KcoverHealthy"


class NodeAction(StrEnum):
    """What to do with the node (``decide_node``'s answer)."""

    NONE = "none"  # healthy and not quarantined: only the condition is refreshed
    QUARANTINE = "quarantine"
    KEEP = "keep"  # quarantined, not yet released (pass count updated)
    RELEASE = "release"
    REFUSED_FOREIGN_CORDON = "refused_foreign_cordon"  # someone else cordoned it: hands off
    REFUSED_BREAKER = "refused_breaker"  # too many quarantines recently
    DISABLED = "disabled"  # the policy does not quarantine; the condition still says unhealthy


@dataclass(frozen=True)
class QuarantinePolicy:
    enabled: bool = True
    release_after_passes: int = 3
    max_share: float = 0.1
    min_allowed: int = 1
    window_s: float = 3600.0


@dataclass(frozen=True)
class Taint:
    key: str
    value: str
    effect: str


@dataclass(frozen=True)
class NodeView:
    """What the policy needs of a node."""

    name: str
    unschedulable: bool = False
    taints: tuple[Taint, ...] = ()
    annotations: dict[str, str] = field(default_factory=dict)

    @property
    def quarantined_by_kcover(self) -> bool:
        return ANNOTATION_QUARANTINED in self.annotations

    @property
    def passes(self) -> int:
        raw = self.annotations.get(ANNOTATION_PASSES, "0")
        return int(raw) if raw.isdigit() else 0

    def quarantined_since(self) -> datetime | None:
        return parse_rfc3339(self.annotations.get(ANNOTATION_SINCE))


@dataclass(frozen=True)
class NodeDecision:
    action: NodeAction
    reason: str
    passes: int = 0  # the consecutive-pass count to store (quarantined nodes)


def breaker_allows(nodes: list[NodeView], now: datetime, policy: QuarantinePolicy) -> tuple[bool, str]:
    """Whether one more quarantine stays within ``max_share`` of the nodes for the window."""
    recent = 0
    for node in nodes:
        since = node.quarantined_since()
        if node.quarantined_by_kcover and since is not None and (now - since).total_seconds() <= policy.window_s:
            recent += 1
    limit = max(policy.min_allowed, math.floor(policy.max_share * len(nodes)))
    if recent + 1 > limit:
        return False, (
            f"circuit breaker: {recent} of {len(nodes)} nodes quarantined in the last {policy.window_s:g} s, "
            f"limit {limit} ({policy.max_share:.0%})"
        )
    return True, f"{recent} of {len(nodes)} quarantined recently, limit {limit}"


def decide_node(
    node: NodeView, healthy: bool, problem: str, cluster: list[NodeView], now: datetime, policy: QuarantinePolicy
) -> NodeDecision:
    """One decision for ``node`` after a health run (``healthy``; ``problem`` names what failed)."""
    if node.quarantined_by_kcover:
        if not healthy:
            return NodeDecision(NodeAction.KEEP, f"still failing: {problem}", passes=0)
        passes = node.passes + 1
        if passes >= policy.release_after_passes:
            return NodeDecision(NodeAction.RELEASE, f"{passes} consecutive passes", passes=passes)
        return NodeDecision(NodeAction.KEEP, f"{passes} of {policy.release_after_passes} passes to release",
                            passes=passes)
    if healthy:
        return NodeDecision(NodeAction.NONE, "healthy")
    if not policy.enabled:
        return NodeDecision(NodeAction.DISABLED, f"unhealthy ({problem}); quarantine disabled by policy")
    if node.unschedulable:
        return NodeDecision(NodeAction.REFUSED_FOREIGN_CORDON,
                            f"unhealthy ({problem}); cordoned by someone else, untouched")
    allowed, why = breaker_allows(cluster, now, policy)
    if not allowed:
        return NodeDecision(NodeAction.REFUSED_BREAKER, f"unhealthy ({problem}); {why}")
    return NodeDecision(NodeAction.QUARANTINE, problem)
