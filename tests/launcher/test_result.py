"""What an attempt returns and how the run reports it: outcome names, productive time, the JSON of an attempt."""

from __future__ import annotations

import pytest

from kcover.decide.lifecycle import JobPhase
from kcover.exit_codes import ExitCode
from kcover.faults import Action, Verdict
from kcover.launcher.reporting import AttemptRecord, RunResult, run_document
from kcover.launcher.result import AttemptOutcome, AttemptResult

NOTHING = Verdict(root=None, action=Action.NONE)


def test_outcome_names_are_the_ones_json_and_history_always_used() -> None:
    assert [o.value for o in AttemptOutcome] == ["succeeded", "failed", "hung", "interrupted", "running",
                                                "straggler"]


def test_exit_codes_are_the_documented_ones() -> None:
    assert {c.name: c.value for c in ExitCode} == {
        "SUCCESS": 0, "FAILED": 1, "USAGE": 2, "OUTPUT_ERROR": 74, "INTERRUPTED": 130, "CLOSED_PIPE": 141}


@pytest.mark.parametrize(
    ("outcome", "checkpoint", "productive"),
    [(AttemptOutcome.SUCCEEDED, None, 90.0), (AttemptOutcome.FAILED, 60.0, 50.0), (AttemptOutcome.FAILED, None, 0.0)],
)
def test_productive_time_ends_at_the_last_checkpoint_unless_the_attempt_succeeded(
        outcome: AttemptOutcome, checkpoint: float | None, productive: float) -> None:
    result = AttemptResult(outcome, NOTHING, ended=100.0, first_progress=10.0, last_checkpoint=checkpoint)
    assert AttemptRecord(1, ("node-0",), 0.0, result).productive() == productive


def test_an_attempt_that_never_ended_is_reported_running_with_no_timings() -> None:
    run = RunResult(status=JobPhase.FAILED, started=0.0, ended=5.0, attempts=[AttemptRecord(1, ("node-0",), 1.0)])
    document = run_document(run)
    [attempt] = document["attempts"]
    assert attempt["outcome"] == "running" and attempt["max_step"] is None
    assert set(attempt["timings"].values()) == {None, 0.0}
    assert document["status"] == "failed" and run.exit_code is ExitCode.FAILED


def test_an_ended_attempt_is_reported_with_its_result_and_decision() -> None:
    result = AttemptResult(AttemptOutcome.HUNG, NOTHING, ended=31.0, launched=2.0, first_progress=5.0,
                           stop_began=30.0, max_step=12, hung_at=12)
    run = RunResult(status=JobPhase.INTERRUPTED, started=0.0, ended=40.0,
                    attempts=[AttemptRecord(1, ("node-0",), 1.0, result, "restart", "hang")])
    [attempt] = run_document(run)["attempts"]
    assert (attempt["outcome"], attempt["max_step"], attempt["decision"], attempt["reason"]) == ("hung", 12, "restart",
                                                                                                "hang")
    assert attempt["timings"]["launch_seconds"] == 1.0 and attempt["timings"]["stop_seconds"] == 1.0
    assert run.exit_code is ExitCode.INTERRUPTED
