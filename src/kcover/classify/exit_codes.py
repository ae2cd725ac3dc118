"""Exit statuses and Kubernetes termination reasons as faults, from the same catalog.

A worker that dies without a word still says something: its exit status.
Rules list the statuses they explain (``exit_codes: [137, -9]``) and the
Kubernetes reasons (``reasons: [OOMKilled]``); this module looks them up.
Negative codes are signals as Python reports them (-9 = SIGKILL).
"""

from __future__ import annotations

from collections.abc import Sequence

from kcover.classify.rules import Rule

FALLBACK_RULE = "process.abnormal-exit"


def rule_for_exit(rules: Sequence[Rule], code: int) -> Rule | None:
    """The rule explaining a non-zero exit status (the generic one when none names it)."""
    if code == 0:
        return None
    named = [rule for rule in rules if code in rule.spec.exit_codes]
    if named:
        return max(named, key=lambda rule: rule.spec.priority)
    return next((rule for rule in rules if rule.id == FALLBACK_RULE), None)


def rule_for_reason(rules: Sequence[Rule], reason: str) -> Rule | None:
    """The rule for a Kubernetes termination or event reason, if any."""
    named = [rule for rule in rules if reason in rule.spec.reasons]
    return max(named, key=lambda rule: rule.spec.priority) if named else None


def describe_exit(code: int) -> str:
    """An evidence line for an exit status, in the words the catalog patterns use."""
    if code < 0:
        return f"worker exited with exit code {128 - code} (killed by signal {-code})"
    return f"worker exited with exit code {code}"
