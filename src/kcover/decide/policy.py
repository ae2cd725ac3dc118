"""What to do after an attempt failed: the pure recovery policy.

:func:`decide` takes the policy, what happened before, and how this attempt
ended (its verdict, where it hung, which nodes it ran on), and returns a
:class:`Decision`: restart after a backoff delay (possibly on other nodes), or
fail with a one-line reason.  No I/O, no clock: the same function serves the
local launcher and the Kubernetes operator, and tests drive it exhaustively.

The rules, in order:

1. The retry budget (``max_restarts``) is never exceeded.
2. A fault that a restart cannot fix (``retriable: false``) fails the job at
   once, except ``user_code``, which gets ``user_code_retries`` retries (one by
   default) in case it was a fluke.  A failure no rule recognises
   (``job.unrecognised-failure``: the log ends in an error nobody named) is
   restarted within the same budget, shared with ``user_code``.
3. A hang at the same step as an earlier hang is deterministic: fail.
4. When the verdict blames nodes, they are excluded; each is replaced by a
   spare, or the job shrinks if ``min_nodes`` allows, or the job fails.
   ``min_nodes=0`` leaves placement to a scheduler (the operator's default:
   on Kubernetes the excluded node is quarantined and the scheduler places the
   new pods on any other node; pods that cannot be placed stay Pending, visibly).
5. Otherwise restart: the first restart at once, then after
   ``backoff_initial × backoff_factor^(n - 1)`` seconds (capped at ``backoff_max``), where ``n``
   counts the restarts of the current *streak*: an attempt that ran ``backoff_reset`` seconds
   (10 minutes) before it failed starts a new streak, so a job that fails once a day is restarted at
   once every time, while one that keeps crashing waits longer and longer.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum

from kcover.faults import UNRECOGNISED_FAILURE_RULE, USER_BUDGET_RULES, Action, Category, Verdict


@dataclass(frozen=True)
class RecoveryPolicy:
    """The knobs of recovery (all have safe defaults)."""

    max_restarts: int = 3
    user_code_retries: int = 1
    backoff_initial: float = 1.0
    backoff_factor: float = 2.0
    backoff_max: float = 60.0
    backoff_reset: float = 600.0
    exclude_nodes: bool = True
    min_nodes: int | None = None


@dataclass(frozen=True)
class AttemptEnd:
    """How one attempt ended: the input of :func:`decide`."""

    verdict: Verdict
    nodes: tuple[str, ...]
    hung_at_step: int | None = None
    ran_for: float | None = None
    """Seconds the attempt ran before it failed (None: unknown, the streak goes on)."""


@dataclass(frozen=True)
class PastFailure:
    category: Category | None
    rule: str | None
    hung_at_step: int | None


@dataclass(frozen=True)
class RecoveryState:
    """What recovery remembers between attempts."""

    restarts: int = 0
    failures: tuple[PastFailure, ...] = ()
    excluded: tuple[str, ...] = ()
    spares: tuple[str, ...] = ()
    streak: int = 0
    """Restarts since the last attempt that ran ``backoff_reset`` seconds: what the backoff grows with."""


class DecisionKind(StrEnum):
    RESTART = "restart"
    FAIL = "fail"


@dataclass(frozen=True)
class Decision:
    kind: DecisionKind
    reason: str
    delay: float = 0.0
    nodes: tuple[str, ...] = ()
    excluded: tuple[str, ...] = field(default=())


def backoff(policy: RecoveryPolicy, restarts: int) -> float:
    """Seconds to wait before restart number ``restarts + 1``: the first is immediate."""
    if restarts == 0:
        return 0.0
    return float(min(policy.backoff_max, policy.backoff_initial * policy.backoff_factor ** (restarts - 1)))


def _on_user_budget(failure: PastFailure) -> bool:
    """Whether a failure spends the user-code retry budget (user code, unrecognised, a generic exception)."""
    return failure.category is Category.USER_CODE or failure.rule in USER_BUDGET_RULES


def decide(policy: RecoveryPolicy, state: RecoveryState, end: AttemptEnd) -> tuple[Decision, RecoveryState]:
    """The decision after a failed attempt, and the state to remember for the next one."""
    verdict = end.verdict
    failure = PastFailure(verdict.category, verdict.rule, end.hung_at_step)
    remembered = replace(state, failures=(*state.failures, failure))
    what = verdict.reason or "the attempt failed"

    def fail(reason: str) -> tuple[Decision, RecoveryState]:
        return Decision(DecisionKind.FAIL, reason, nodes=end.nodes), remembered

    if state.restarts >= policy.max_restarts:
        return fail(f"retry budget exhausted after {state.restarts} restart(s); last: {what}")
    if verdict.action is Action.FAIL and not _on_user_budget(failure):
        return fail(f"not retriable: {what}")
    unrecognised = verdict.rule == UNRECOGNISED_FAILURE_RULE
    if verdict.action is Action.FAIL or unrecognised:
        earlier = sum(1 for f in state.failures if _on_user_budget(f))
        if earlier >= policy.user_code_retries:
            kind = "failure no rule recognises" if unrecognised else "deterministic user error"
            return fail(f"{kind}, seen {earlier + 1} times: {what}")
    if end.hung_at_step is not None and any(f.hung_at_step == end.hung_at_step for f in state.failures):
        return fail(f"hang recurred at step {end.hung_at_step}: deterministic, not retrying")
    nodes, spares, excluded = list(end.nodes), list(state.spares), list(state.excluded)
    newly: list[str] = []
    if verdict.action is Action.RESTART_EXCLUDING_NODES and policy.exclude_nodes:
        for bad in verdict.nodes:
            if bad not in nodes:
                continue
            newly.append(bad)
            excluded.append(bad)
            if spares:
                nodes[nodes.index(bad)] = spares.pop(0)
            else:
                nodes.remove(bad)
        floor = policy.min_nodes if policy.min_nodes is not None else max(len(end.nodes), 1)
        if len(nodes) < floor:
            return fail(f"no healthy node left to replace {', '.join(newly)} (need {floor}); {what}")
    healthy = end.ran_for is not None and end.ran_for >= policy.backoff_reset
    streak = 0 if healthy else state.streak
    delay = backoff(policy, streak)
    reason = f"restart {state.restarts + 1}/{policy.max_restarts} in {delay:g}s: {what}"
    if newly:
        reason += f"; excluding {', '.join(newly)}"
    decision = Decision(DecisionKind.RESTART, reason, delay=delay, nodes=tuple(nodes), excluded=tuple(newly))
    new_state = replace(
        remembered, restarts=state.restarts + 1, excluded=tuple(excluded), spares=tuple(spares), streak=streak + 1
    )
    return decision, new_state
