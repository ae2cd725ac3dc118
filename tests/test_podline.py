"""``kcover-pod:`` lines: what ``kcover pod`` says and the agent reads, round trips and hostile lines.

Anything a training script prints lands in the same container log, so every
parser here must refuse what is not exactly a report — quickly, however long
the line — and never raise.
"""

from __future__ import annotations

import time

import pytest

from kcover.podline import MAX_TIMINGS, PREFIX, PodReport, PodState, PodTimings, parse, parse_timings


def test_reports_with_a_first_step_or_a_checkpoint_round_trip() -> None:
    for report in (PodReport(3, PodState.RUNNING, step=120, at=1_796_000_000.125),
                   PodReport(3, PodState.RUNNING, checkpoint=100, at=1_796_000_010.5),
                   PodReport(0, PodState.FAILED, rank=5, exit=-9, step=7, reason="a reason with = signs")):
        assert parse("2026-12-02T10:00:00Z stdout F " + report.line()) == report


@pytest.mark.parametrize("at", ["-5", "1e9", "nan", "12345678901.5", "1.1234567", "x", ""])
def test_a_time_that_is_not_epoch_seconds_is_dropped_not_the_report(at: str) -> None:
    found = parse(f"{PREFIX}generation=1 state=running checkpoint=40 at={at}")
    assert found is not None and found.checkpoint == 40 and found.at is None


def test_timings_round_trip_with_gaps() -> None:
    timings = PodTimings(2, 5, 1180, (0.512, None, 0.503))
    assert parse_timings("prefix " + timings.line()) == timings
    assert timings.steps() == [(1180, 0.512), (1182, 0.503)]
    assert parse(timings.line()) is None  # not a state report: the agent's two parsers never both match


@pytest.mark.parametrize("body", [
    "generation=1 timing rank=0 from=0 seconds=nan",
    "generation=1 timing rank=0 from=0 seconds=inf",
    "generation=1 timing rank=0 from=0 seconds=-0.5",
    "generation=1 timing rank=0 from=0 seconds=0",
    "generation=1 timing rank=0 from=0 seconds=1e400",
    "generation=1 timing rank=0 from=0 seconds=1,,2",
    "generation=1 timing rank=0 from=0 seconds=" + ",".join(["0.1"] * (MAX_TIMINGS + 1)),
    "generation=99999999999 timing rank=0 from=0 seconds=0.1",
    "generation=1 timing rank=-1 from=0 seconds=0.1",
    "generation=1 timing rank=0 from=-3 seconds=0.1",
    "generation=1 timing rank=0 from=0 seconds=0.1 trailing",
    "generation=1 timing rank=0 from=0 seconds=" + "1" * (1 << 20),
])
def test_a_bad_timing_line_is_refused_whole(body: str) -> None:
    assert parse_timings(PREFIX + body) is None


@pytest.mark.timeout(120, method="thread")
def test_one_mebibyte_lines_get_through_both_parsers() -> None:
    """Must return (the patterns are linear): a backtracking parser would stall the agent's loop for minutes."""
    repeated = PREFIX + "generation=1 " + "state=running " * 75_000
    assert parse_timings(repeated) is None and parse(repeated) == PodReport(1, PodState.RUNNING)
    for line in (PREFIX + "generation=1 timing rank=0 from=0 seconds=" + "0.1," * 260_000,
                 PREFIX + "generation=" + "9" * (1 << 20), PREFIX + " reason=" + "=" * (1 << 20)):
        assert parse_timings(line) is None and parse(line) is None


def test_a_long_report_like_line_is_read_in_linear_time() -> None:
    """A line the runtime cut and kcover rejoined may be 100 KB or more behind the prefix (the agent reads each)."""
    began = time.perf_counter()
    assert parse("kcover-pod: " + "y" * 1_000_000) is None
    assert parse("kcover-pod: generation=3 state=running " + "ab-cd " * 200_000) is not None
    assert time.perf_counter() - began < 2  # [a-z-]+= backtracked from every letter: 33 s for 100 KB
