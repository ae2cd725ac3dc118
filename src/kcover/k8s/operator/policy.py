"""A job's recovery policy: built-in defaults, then the RecoveryPolicy resource, then the job's annotations.

The RecoveryPolicy custom resource (``kcover.io/v1alpha1``) named ``default``
sets defaults for its namespace; one named ``default`` in the operator's own
namespace sets them for the whole cluster.  Its schema is enforced by the API
server.  Per-job annotations override both.  A malformed annotation never
crashes anything: it is reported (the caller posts a Warning Event naming the
key and the value used) and the default applies.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from kcover.decide.policy import RecoveryPolicy
from kcover.decide.straggler_action import StragglerAction
from kcover.k8s.names import (
    EXCLUDE_NODES,
    GRACE_PERIOD,
    IN_PLACE,
    IN_PLACE_TIMEOUT,
    MAX_RESTARTS,
    STANDBY,
    STRAGGLER_ACTION,
    TOTAL_STEPS,
    USER_CODE_RETRIES,
)

GROUP, VERSION, PLURAL = "kcover.io", "v1alpha1", "recoverypolicies"


@dataclass(frozen=True)
class JobPolicy:
    # the scheduler places the new pods: kcover quarantines the bad node, it does not count the good ones
    recovery: RecoveryPolicy = field(default_factory=lambda: RecoveryPolicy(min_nodes=0))
    grace_period: int = 30
    quarantine_max_share: float = 0.1
    quarantine: bool = True
    in_place: bool = True
    """Restart the workers of pods that run ``kcover pod`` in place when no node is blamed."""
    in_place_timeout: float = 60.0
    """Seconds from the order until every pod runs the new generation; then its pods are restarted instead."""
    straggler_action: StragglerAction = StragglerAction.REPORT
    """``replace``: restart the job without a straggler's node when a spare node exists and it pays."""
    total_steps: int | None = None
    """The job's number of steps (per job only): what finishing at the healthy pace would save."""
    standby: int = 0
    """How many of the job's pods are warm standbys (per job only; its pods run ``kcover pod --assigned-rank``):
    a blamed node's rank is handed to one and every other pod restarts in place."""


def from_resource(base: JobPolicy, spec: Mapping[str, Any]) -> JobPolicy:
    """Apply a RecoveryPolicy's spec (already validated by the API server's schema)."""
    recovery = base.recovery
    if "maxRestarts" in spec:
        recovery = replace(recovery, max_restarts=int(spec["maxRestarts"]))
    if "userCodeRetries" in spec:
        recovery = replace(recovery, user_code_retries=int(spec["userCodeRetries"]))
    if "backoffSeconds" in spec:
        recovery = replace(recovery, backoff_initial=float(spec["backoffSeconds"]))
    if "backoffResetSeconds" in spec:
        recovery = replace(recovery, backoff_reset=float(spec["backoffResetSeconds"]))
    if "excludeNodes" in spec:
        recovery = replace(recovery, exclude_nodes=bool(spec["excludeNodes"]))
    return JobPolicy(
        recovery=recovery,
        grace_period=int(spec.get("gracePeriodSeconds", base.grace_period)),
        quarantine_max_share=float(spec.get("quarantineMaxShare", base.quarantine_max_share)),
        quarantine=recovery.exclude_nodes,
        in_place=bool(spec.get("inPlace", base.in_place)),
        in_place_timeout=float(spec.get("inPlaceTimeoutSeconds", base.in_place_timeout)),
        straggler_action=StragglerAction(spec.get("stragglerAction", base.straggler_action.value)),
        total_steps=base.total_steps,
        standby=base.standby,
    )


def _integer(text: str, low: int, high: int) -> int:
    value = int(text)
    if not low <= value <= high:
        raise ValueError(f"must be between {low} and {high}")
    return value


def _boolean(text: str) -> bool:
    if text.lower() in ("true", "yes", "1"):
        return True
    if text.lower() in ("false", "no", "0"):
        return False
    raise ValueError("must be true or false")


def _set_max_restarts(policy: JobPolicy, text: str) -> JobPolicy:
    return replace(policy, recovery=replace(policy.recovery, max_restarts=_integer(text, 0, 1000)))


def _set_user_code_retries(policy: JobPolicy, text: str) -> JobPolicy:
    return replace(policy, recovery=replace(policy.recovery, user_code_retries=_integer(text, 0, 100)))


def _set_exclude_nodes(policy: JobPolicy, text: str) -> JobPolicy:
    value = _boolean(text)
    return replace(policy, recovery=replace(policy.recovery, exclude_nodes=value), quarantine=value)


def _set_grace_period(policy: JobPolicy, text: str) -> JobPolicy:
    return replace(policy, grace_period=_integer(text, 0, 3600))


def _set_in_place(policy: JobPolicy, text: str) -> JobPolicy:
    return replace(policy, in_place=_boolean(text))


def _set_in_place_timeout(policy: JobPolicy, text: str) -> JobPolicy:
    return replace(policy, in_place_timeout=float(_integer(text, 1, 3600)))


def _set_straggler_action(policy: JobPolicy, text: str) -> JobPolicy:
    try:
        return replace(policy, straggler_action=StragglerAction(text))
    except ValueError:
        raise ValueError("must be report or replace") from None


def _set_total_steps(policy: JobPolicy, text: str) -> JobPolicy:
    return replace(policy, total_steps=_integer(text, 1, 10**12))


def _set_standby(policy: JobPolicy, text: str) -> JobPolicy:
    return replace(policy, standby=_integer(text, 0, 10_000))


SETTERS: dict[str, Callable[[JobPolicy, str], JobPolicy]] = {
    MAX_RESTARTS: _set_max_restarts,
    USER_CODE_RETRIES: _set_user_code_retries,
    EXCLUDE_NODES: _set_exclude_nodes,
    GRACE_PERIOD: _set_grace_period,
    IN_PLACE: _set_in_place,
    IN_PLACE_TIMEOUT: _set_in_place_timeout,
    STRAGGLER_ACTION: _set_straggler_action,
    TOTAL_STEPS: _set_total_steps,
    STANDBY: _set_standby,
}


def with_annotations(base: JobPolicy, annotations: Mapping[str, str]) -> tuple[JobPolicy, list[str]]:
    """Apply per-job annotations; returns the policy and one warning per malformed key."""
    policy = base
    warnings = []
    for key, setter in SETTERS.items():
        if key not in annotations:
            continue
        try:
            policy = setter(policy, annotations[key])
        except ValueError as error:
            warnings.append(f"annotation {key}={annotations[key]!r} ignored ({error}); using the default")
    return policy, warnings
