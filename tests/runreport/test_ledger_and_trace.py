"""Pure parts: the lost-time ledger tiles every attempt exactly, and an attempt's trace stays bounded."""

from __future__ import annotations

import itertools
import math

import pytest

from kcover.launcher.result import MAX_SAMPLES, TraceRecorder
from kcover.runreport.ledger import KINDS, attempt_segments, run_segments, totals
from kcover.runreport.model import AttemptRow, RunData

T = 1000.0


def attempt(number: int = 1, outcome: str = "failed", started: float = T, ended: float | None = T + 100,
            steps: tuple[tuple[float, int], ...] = (), **moments: float | None) -> AttemptRow:
    return AttemptRow(number=number, started=started, ended=ended, nodes=("node-0",), outcome=outcome, verdict={},
                      decision="restart", reason="", moments=moments, steps=steps)


def test_a_failed_attempt_splits_into_named_parts() -> None:
    parts = attempt_segments(attempt(first_progress=T + 10, last_checkpoint=T + 40, first_fault=T + 50,
                                     stop_began=T + 55, stopped=T + 60))
    assert [(p.kind, p.seconds) for p in parts] == [("startup", 10), ("productive", 30), ("redone", 10),
                                                    ("detection", 5), ("shutdown", 5), ("backoff", 40)]


def test_a_hang_is_detected_from_its_last_step() -> None:
    parts = attempt_segments(attempt(number=2, outcome="hung", steps=((T + 20, 5), (T + 30, 6)),
                                     first_progress=T + 20, last_checkpoint=T + 25, first_fault=T + 90,
                                     stop_began=T + 90, stopped=T + 91))
    assert {p.kind: p.seconds for p in parts} == {"restart": 20, "productive": 5, "redone": 5, "detection": 60,
                                                  "shutdown": 1, "backoff": 9}


def test_a_succeeded_attempt_is_productive_to_its_end() -> None:
    parts = attempt_segments(attempt(outcome="succeeded", first_progress=T + 10, stop_began=T + 99, stopped=T + 99))
    assert {p.kind: p.seconds for p in parts} == {"startup": 10, "productive": 89, "backoff": 1}


@pytest.mark.parametrize("bad", [None, -1e12, 0.0, T - 5, T + 1e9, math.inf])
def test_any_moments_tile_the_attempt_with_no_negative_part(bad: float | None) -> None:
    row = attempt(first_progress=bad, last_checkpoint=T + 30, first_fault=bad, stop_began=T + 20, stopped=bad)
    parts = attempt_segments(row)
    assert all(p.seconds >= 0 for p in parts)
    assert parts[0].start == T and parts[-1].end == T + 100
    assert all(a.end == b.start for a, b in itertools.pairwise(parts))


def test_the_run_adds_up_to_its_wall_time() -> None:
    run = RunData(run_id=1, started=T - 5, ended=T + 250, status="succeeded", command="x", restarts=1, ettr=None,
                  reason="", run_dir=None, nproc_per_node=1, excluded=(),
                  attempts=(attempt(first_progress=T + 10, stopped=T + 50),
                            attempt(2, "succeeded", T + 120, T + 200, first_progress=T + 130, stopped=T + 200)),
                  faults=())
    spent = totals(run_segments(run))
    assert set(spent) == set(KINDS)
    assert sum(spent.values()) == pytest.approx(255)
    assert spent["other"] == pytest.approx(5 + 50 + 20)  # before, between (unrecorded gap) and after the attempts


def test_the_trace_keeps_a_bounded_even_sample() -> None:
    trace = TraceRecorder()
    for step in range(100_000):
        trace.step(float(step), step)
        trace.fault(("rule", step % 3, None), float(step))
    frozen = trace.freeze()
    assert MAX_SAMPLES // 2 <= len(frozen.steps) < MAX_SAMPLES
    strides = {b[1] - a[1] for a, b in zip(frozen.steps, frozen.steps[1:], strict=False)}
    assert len(strides) == 1  # evenly spaced
    assert frozen.steps[0] == (0.0, 0)
    assert dict(frozen.faults) == {("rule", 0, None): 0.0, ("rule", 1, None): 1.0, ("rule", 2, None): 2.0}
