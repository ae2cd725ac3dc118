"""The recovery policy, driven exhaustively: it is pure, so every rule is a plain call."""

from __future__ import annotations

import pytest

from kcover import Action, explain
from kcover.decide.lifecycle import IllegalTransitionError, JobPhase, Lifecycle
from kcover.decide.policy import (
    AttemptEnd,
    DecisionKind,
    RecoveryPolicy,
    RecoveryState,
    decide,
)
from kcover.faults import Verdict

XID = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python, GPU has fallen off the bus.\n"
NODES = ("node-0", "node-1")


def verdict_on(text: str, node: str = "node-1") -> Verdict:
    import io

    from kcover.classify.attribution import attribute
    from kcover.classify.collector import FaultCollector
    from kcover.classify.matcher import default_matcher
    from kcover.collect.sources import SourceInfo
    from kcover.explain import scan_stream

    collector = FaultCollector()
    scan_stream(default_matcher(), io.BytesIO(text.encode()), SourceInfo("rank1", rank=1, node=node), collector)
    return attribute(collector.faults)


def test_hardware_fault_excludes_the_node_and_uses_a_spare() -> None:
    state = RecoveryState(spares=("node-2",))
    decision, state = decide(RecoveryPolicy(), state, AttemptEnd(verdict_on(XID), NODES))
    assert decision.kind is DecisionKind.RESTART
    assert decision.nodes == ("node-0", "node-2")
    assert decision.excluded == ("node-1",)
    assert state.excluded == ("node-1",)
    assert state.spares == ()
    assert state.restarts == 1


def test_a_log_naming_a_node_outside_the_job_excludes_nothing_there() -> None:
    """A worker's log may name any node (Slurm's node failure, a hostile line): only the job's
    own nodes are ever excluded, so a job cannot get another job's node drained."""
    verdict = verdict_on("srun: error: Node failure on gpu-node-77\n")
    assert verdict.nodes == ("gpu-node-77",) and verdict.action is Action.RESTART_EXCLUDING_NODES
    decision, state = decide(RecoveryPolicy(), RecoveryState(spares=("node-2",)), AttemptEnd(verdict, NODES))
    assert decision.kind is DecisionKind.RESTART
    assert decision.excluded == () and decision.nodes == NODES
    assert state.excluded == () and state.spares == ("node-2",)


def test_without_spares_the_job_shrinks_only_when_allowed() -> None:
    end = AttemptEnd(verdict_on(XID), NODES)
    fixed, _ = decide(RecoveryPolicy(), RecoveryState(), end)
    assert fixed.kind is DecisionKind.FAIL
    assert "no healthy node left" in fixed.reason
    elastic, _ = decide(RecoveryPolicy(min_nodes=1), RecoveryState(), end)
    assert elastic.kind is DecisionKind.RESTART
    assert elastic.nodes == ("node-0",)


def test_min_nodes_zero_leaves_placement_to_the_scheduler() -> None:
    """The operator's policy: the job's only node is bad, the scheduler will place the pods elsewhere."""
    only = AttemptEnd(verdict_on(XID), ("node-1",))
    assert decide(RecoveryPolicy(min_nodes=1), RecoveryState(), only)[0].kind is DecisionKind.FAIL
    placed, state = decide(RecoveryPolicy(min_nodes=0), RecoveryState(), only)
    assert placed.kind is DecisionKind.RESTART
    assert (placed.nodes, placed.excluded, state.excluded) == ((), ("node-1",), ("node-1",))


def test_exclusion_can_be_switched_off() -> None:
    decision, _ = decide(RecoveryPolicy(exclude_nodes=False), RecoveryState(), AttemptEnd(verdict_on(XID), NODES))
    assert decision.kind is DecisionKind.RESTART
    assert decision.nodes == NODES


def test_user_code_gets_one_retry_then_fails() -> None:
    end = AttemptEnd(explain("KeyError: 'labels'\n"), NODES)
    assert end.verdict.action is Action.FAIL
    first, state = decide(RecoveryPolicy(), RecoveryState(), end)
    assert first.kind is DecisionKind.RESTART
    second, _ = decide(RecoveryPolicy(), state, end)
    assert second.kind is DecisionKind.FAIL
    assert "deterministic user error" in second.reason


@pytest.mark.parametrize("retries", [0, 2])
def test_user_code_retries_is_configurable(retries: int) -> None:
    end = AttemptEnd(explain("KeyError: 'labels'\n"), NODES)
    policy = RecoveryPolicy(user_code_retries=retries)
    state = RecoveryState()
    kinds = []
    for _ in range(retries + 1):
        decision, state = decide(policy, state, end)
        kinds.append(decision.kind)
    assert kinds == [DecisionKind.RESTART] * retries + [DecisionKind.FAIL]


def test_non_retriable_infrastructure_fault_fails_at_once() -> None:
    end = AttemptEnd(explain("OSError: [Errno 28] No space left on device\n"), NODES)
    decision, _ = decide(RecoveryPolicy(), RecoveryState(), end)
    assert decision.kind is DecisionKind.FAIL
    assert decision.reason.startswith("not retriable")


def test_budget_is_never_exceeded_and_backoff_grows() -> None:
    end = AttemptEnd(explain("RuntimeError: CUDA error: unspecified launch failure\n"), NODES)
    policy = RecoveryPolicy(max_restarts=4, backoff_initial=1, backoff_factor=2, backoff_max=4)
    state = RecoveryState()
    delays = []
    while True:
        decision, state = decide(policy, state, end)
        if decision.kind is DecisionKind.FAIL:
            break
        delays.append(decision.delay)
    assert delays == [0, 1, 2, 4]
    assert "retry budget exhausted after 4" in decision.reason


@pytest.mark.parametrize("ran_for", [None, 0.0, 599.9, float("nan")])
def test_quick_failures_keep_their_streak_and_wait_longer(ran_for: float | None) -> None:
    end = AttemptEnd(explain("RuntimeError: CUDA error: unspecified launch failure\n"), NODES, ran_for=ran_for)
    policy = RecoveryPolicy(max_restarts=100, backoff_initial=1, backoff_factor=2, backoff_max=60)
    state, delays = RecoveryState(), []
    for _ in range(9):
        decision, state = decide(policy, state, end)
        delays.append(decision.delay)
    assert delays == [0, 1, 2, 4, 8, 16, 32, 60, 60] and state.streak == 9


def test_a_job_that_ran_long_enough_before_failing_restarts_at_once_and_counts_anew() -> None:
    """The backoff is for crash loops: a failure after a healthy run (10 minutes by default) starts a new streak,
    while the retry budget still counts every restart."""
    fault = explain("RuntimeError: CUDA error: unspecified launch failure\n")
    policy = RecoveryPolicy(max_restarts=100, backoff_initial=1, backoff_factor=2, backoff_max=60)
    state = RecoveryState(restarts=8, streak=8)
    decision, state = decide(policy, state, AttemptEnd(fault, NODES, ran_for=3600.0))
    assert decision.delay == 0 and state.streak == 1 and state.restarts == 9
    decision, state = decide(policy, state, AttemptEnd(fault, NODES, ran_for=5.0))
    assert decision.delay == 1 and state.streak == 2
    decision, state = decide(policy, state, AttemptEnd(fault, NODES, ran_for=policy.backoff_reset))
    assert decision.delay == 0 and "restart 11/100" in decision.reason


def test_hang_at_the_same_step_twice_is_deterministic() -> None:
    hang = explain("No training progress for 60 s\n")
    first, state = decide(RecoveryPolicy(), RecoveryState(), AttemptEnd(hang, NODES, hung_at_step=30))
    assert first.kind is DecisionKind.RESTART
    elsewhere, state2 = decide(RecoveryPolicy(), state, AttemptEnd(hang, NODES, hung_at_step=31))
    assert elsewhere.kind is DecisionKind.RESTART
    again, _ = decide(RecoveryPolicy(), state2, AttemptEnd(hang, NODES, hung_at_step=30))
    assert again.kind is DecisionKind.FAIL
    assert "step 30" in again.reason


def test_lifecycle_refuses_illegal_moves() -> None:
    life = Lifecycle(now=0.0)
    life.move(JobPhase.RUNNING, 1.0)
    life.move(JobPhase.STOPPING, 2.0)
    life.move(JobPhase.BACKOFF, 3.0)
    life.move(JobPhase.STARTING, 4.0)
    with pytest.raises(IllegalTransitionError):
        life.move(JobPhase.BACKOFF, 5.0)
    life.move(JobPhase.RUNNING, 5.0)
    life.move(JobPhase.SUCCEEDED, 6.0)
    assert life.finished
    with pytest.raises(IllegalTransitionError):
        life.move(JobPhase.RUNNING, 7.0)
