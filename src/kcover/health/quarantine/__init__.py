"""Quarantine: take a node kcover found unhealthy out of scheduling, and give it back.

:mod:`~kcover.health.quarantine.policy` is the pure part (no I/O, no clock):
what to do with a node given its health report, its current marks and the
cluster's recent quarantines (the circuit breaker).
:mod:`~kcover.health.quarantine.kube` is the thin Kubernetes actuator: cordon,
taint ``kcover.io/quarantine=<reason>:NoSchedule``, annotations marking that
kcover did it, the ``KcoverHealthy`` NodeCondition, release.  The node agent
(and the operator's fault-driven quarantine) call
:meth:`~kcover.health.quarantine.kube.KubeQuarantine.observe` /
:meth:`~kcover.health.quarantine.kube.KubeQuarantine.quarantine`.
"""

from kcover.health.quarantine.policy import (
    NodeAction,
    NodeDecision,
    NodeView,
    QuarantinePolicy,
    breaker_allows,
    decide_node,
)

__all__ = ["NodeAction", "NodeDecision", "NodeView", "QuarantinePolicy", "breaker_allows", "decide_node"]
