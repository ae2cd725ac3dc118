"""The straggler detector and the replace judgement: pure, so driven with synthetic series."""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import pytest

from kcover.decide.straggler import Straggler, StragglerConfig, StragglerDetector
from kcover.decide.straggler_action import ReplaceCase, judge_replace

Shape = Callable[[int, int, random.Random], float]
"""Seconds of compute of (rank, step)."""


def feed(shape: Shape, ranks: int = 8, steps: int = 400, seed: int = 0,
         detector: StragglerDetector | None = None) -> tuple[StragglerDetector, dict[int, int]]:
    """Run a series through a detector; returns it and the first step each rank was seen flagged."""
    detector = detector or StragglerDetector()
    rng = random.Random(seed)
    first: dict[int, int] = {}
    for step in range(steps):
        for rank in range(ranks):
            detector.observe(rank, step, shape(rank, step, rng))
        for straggler in detector.stragglers():
            first.setdefault(straggler.rank, step)
    return detector, first


def noisy(sigma: float) -> Shape:
    return lambda rank, step, rng: 0.1 * math.exp(rng.gauss(0, sigma))


def uneven(sigma: float, lengths: float = 0.05) -> Shape:
    """Rank 0 does 30% extra every 10th step, the last rank (pipeline stage) is 20% slower, lengths vary."""
    def shape(rank: int, step: int, rng: random.Random) -> float:
        seconds = 0.1 * math.exp(rng.gauss(0, sigma)) * rng.uniform(1 - lengths, 1 + lengths)
        if rank == 0 and step % 10 == 0:
            seconds *= 1.3
        if rank == 7:
            seconds *= 1.2
        return seconds
    return shape


def slowed(base: Shape, rank: int, factor: float, onset: int) -> Shape:
    return lambda r, s, rng: base(r, s, rng) * (factor if r == rank and s >= onset else 1.0)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("sigma", [0.0, 0.02, 0.05])
def test_a_healthy_uneven_job_is_never_flagged(sigma: float, seed: int) -> None:
    _, first = feed(uneven(sigma), steps=2000, seed=seed)
    assert first == {}


@pytest.mark.parametrize("factor", [1.2, 1.5, 3.0])
@pytest.mark.parametrize("sigma", [0.0, 0.02, 0.05])
def test_a_slowed_rank_is_flagged_within_30_steps(sigma: float, factor: float) -> None:
    detector, first = feed(slowed(uneven(sigma), 3, factor, onset=100), steps=200)
    assert set(first) == {3}
    assert first[3] - 100 < 30
    [straggler] = detector.stragglers()
    assert straggler.rank == 3 and straggler.slowdown == pytest.approx(factor, rel=0.1)


def test_widely_varying_sequence_lengths_raise_the_bar_but_flag_nobody() -> None:
    """±30% per rank and step: no false flag in 2,000 steps; only a large slowdown stands out of such noise."""
    _, first = feed(uneven(0.02, lengths=0.3), steps=2000)
    assert first == {}
    _, first = feed(slowed(uneven(0.02, lengths=0.3), 3, 2.0, onset=100), steps=200)
    assert set(first) == {3} and first[3] - 100 < 30


def test_the_uneven_ranks_themselves_slowing_down_are_flagged() -> None:
    _, first = feed(slowed(uneven(0.02), 7, 1.3, onset=100), steps=200)  # the slow-by-design stage gets slower
    assert set(first) == {7}


def test_a_rank_slow_from_the_first_step_is_its_own_baseline() -> None:
    """The documented limit: only a change from a rank's own baseline is a straggler."""
    _, first = feed(slowed(noisy(0.02), 2, 2.0, onset=0), steps=300)
    assert first == {}


def test_the_whole_job_slowing_down_flags_nobody() -> None:
    _, first = feed(lambda rank, step, rng: 0.1 * (3.0 if step >= 100 else 1.0) * math.exp(rng.gauss(0, 0.02)))
    assert first == {}


def test_one_slow_step_is_not_a_straggler() -> None:
    _, first = feed(lambda rank, step, rng: 0.1 * (5.0 if (rank, step) == (4, 150) else 1.0))
    assert first == {}


def test_a_recovered_rank_is_cleared() -> None:
    shape = noisy(0.01)
    detector, first = feed(lambda r, s, rng: shape(r, s, rng) * (1.5 if r == 1 and 100 <= s < 150 else 1.0),
                           steps=220)
    assert set(first) == {1}
    assert detector.stragglers() == []


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, -0.1, 0.0])
def test_bad_timings_are_dropped_and_counted(bad: float) -> None:
    def shape(rank: int, step: int, rng: random.Random) -> float:
        return bad if rank == 2 and step % 3 == 0 else 0.1 * math.exp(rng.gauss(0, 0.02))
    detector, first = feed(shape, steps=300)
    assert first == {}
    assert detector.dropped == 100


def test_a_slow_rank_among_bad_timings_is_still_found() -> None:
    base = slowed(noisy(0.02), 5, 1.5, onset=100)

    def shape(rank: int, step: int, rng: random.Random) -> float:
        return math.nan if step % 4 == 0 else base(rank, step, rng)
    _, first = feed(shape, steps=200)
    assert set(first) == {5}


def test_a_single_rank_has_no_peers_and_is_never_judged() -> None:
    detector, first = feed(lambda rank, step, rng: 0.1 * (3.0 if step > 100 else 1.0), ranks=1)
    assert first == {} and detector.noise is None and detector.threshold is None


def test_two_ranks_are_enough() -> None:
    _, first = feed(slowed(noisy(0.02), 1, 1.3, onset=100), ranks=2, steps=200)
    assert set(first) == {1}


def test_a_rank_that_stops_reporting_is_neither_flagged_nor_held_against_the_others() -> None:
    base = slowed(noisy(0.02), 6, 2.0, onset=100)
    detector = StragglerDetector()
    rng = random.Random(1)
    for step in range(300):
        for rank in range(8):
            if rank == 6 and step >= 140:
                continue  # rank 6 (flagged by then) went silent
            detector.observe(rank, step, base(rank, step, rng))
        if step == 139:
            assert [s.rank for s in detector.stragglers()] == [6]
    assert detector.stragglers() == []


def test_late_timings_for_judged_steps_are_dropped() -> None:
    detector, _ = feed(noisy(0.02), steps=50)
    detector.observe(0, 3, 0.1)
    assert detector.dropped == 1


def test_one_bogus_step_number_does_not_blind_the_detector() -> None:
    base = slowed(noisy(0.02), 5, 1.5, onset=100)
    detector = StragglerDetector()
    rng = random.Random(3)
    for step in range(200):
        for rank in range(8):
            detector.observe(rank, step, base(rank, step, rng))
        if step == 50:
            detector.observe(2, 10**18, 0.1)
    assert detector.dropped == 1
    assert [s.rank for s in detector.stragglers()] == [5]


def test_slowest_first() -> None:
    base = noisy(0.01)
    shape = lambda r, s, rng: base(r, s, rng) * {2: 1.3, 5: 2.0}.get(r, 1.0) ** (s >= 100)  # noqa: E731
    detector, _ = feed(shape, steps=200)
    assert [s.rank for s in detector.stragglers()] == [5, 2]
    assert isinstance(detector.stragglers()[0], Straggler)


def test_a_noisy_job_raises_the_threshold() -> None:
    quiet, _ = feed(noisy(0.01), steps=60)
    loud, _ = feed(noisy(0.3), steps=60)
    assert quiet.threshold is not None and loud.threshold is not None
    assert quiet.threshold == pytest.approx(math.log1p(StragglerConfig().min_slowdown))
    assert loud.threshold > 3 * quiet.threshold


CASE = ReplaceCase(slowdown=1.5, spares=1, remaining_steps=1000, step_seconds=0.3, restart_seconds=20.0,
                   redo_steps=10)


def test_replace_when_the_gain_beats_the_restart_cost() -> None:
    judgement = judge_replace(CASE)
    assert judgement.replace
    assert judgement.gain_seconds == pytest.approx(100.0)
    assert judgement.cost_seconds == pytest.approx(22.0)


@pytest.mark.parametrize(("change", "why"), [
    ({"spares": 0}, "no spare node"),
    ({"remaining_steps": None}, "--total-steps"),
    ({"step_seconds": None}, "not measured"),
    ({"restart_seconds": None}, "not measured"),
    ({"remaining_steps": 100}, "not worth a restart"),
    ({"remaining_steps": -5}, "not worth a restart"),
    ({"slowdown": 1.0}, "not measured"),
])
def test_otherwise_only_report(change: dict[str, object], why: str) -> None:
    from dataclasses import replace
    judgement = judge_replace(replace(CASE, **change))  # type: ignore[arg-type]
    assert not judgement.replace and why in judgement.reason
