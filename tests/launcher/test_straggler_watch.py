"""The attempt's straggler watch: what it says, what it records, and when ``replace`` pays."""

from __future__ import annotations

from kcover.decide.straggler_action import StragglerAction
from kcover.launcher.output import TimingSeen
from kcover.launcher.stragglers import StragglerWatch

NODES = {0: "node-0", 1: "node-0", 2: "node-1", 3: "node-1"}


def drive(watch: StragglerWatch, steps: range, slow: dict[int, float], step_seconds: float = 1.0) -> list[str]:
    """Every rank computes 0.1 s (``slow`` ranks longer) per step; steps come ``step_seconds`` apart."""
    lines: list[str] = []
    for step in steps:
        for rank in NODES:
            watch.timing(TimingSeen(rank, step, 0.1 * slow.get(rank, 1.0)))
        watch.step(step, 100.0 + step * step_seconds, launched=90.0)
        news = watch.check(100.0 + step * step_seconds)
        lines.extend(news.lines)
        if news.replace is not None:
            lines.append(f"REPLACE {news.replace.rank}")
            break
    return lines


def test_report_says_once_records_and_says_the_recovery() -> None:
    watch = StragglerWatch(StragglerAction.REPORT, None, 1, NODES)
    drive(watch, range(0, 50), {})
    lines = drive(watch, range(50, 100), {2: 1.5})
    assert len(lines) == 1 and lines[0].startswith("rank 2 (node-1) is a straggler: computes 1.50x")
    assert drive(watch, range(100, 150), {}) == ["rank 2 (node-1) is back to its usual pace"]
    [record] = watch.freeze()
    assert (record.rank, record.node, record.action, record.slowdown) == (2, "node-1", "reported", 1.5)
    assert 50 <= record.since_step < 70


def test_replace_when_the_remaining_time_pays_for_the_restart() -> None:
    watch = StragglerWatch(StragglerAction.REPLACE, 10_000, 1, NODES)
    drive(watch, range(0, 50), {})
    lines = drive(watch, range(50, 100), {3: 2.0})
    assert lines[-1] == "REPLACE 3" and "replacing its node: gain" in lines[-2]
    assert [r.action for r in watch.freeze()] == ["replaced"]


def test_replace_is_judged_again_as_the_job_goes_on() -> None:
    """At first the steps are quick and no checkpoint limits the redone work: not worth it; later the steps are
    slow and a checkpoint is recent, so it pays."""
    watch = StragglerWatch(StragglerAction.REPLACE, 140, 1, NODES)
    drive(watch, range(0, 50), {})
    lines = drive(watch, range(50, 70), {1: 2.0}, step_seconds=0.1)
    assert len(lines) == 1 and "not worth a restart" in lines[0]
    watch.checkpointed(80)
    lines = drive(watch, range(70, 100), {1: 2.0}, step_seconds=5.0)
    assert lines[-1] == "REPLACE 1"


def test_replace_without_total_steps_or_spares_only_reports() -> None:
    for watch, why in ((StragglerWatch(StragglerAction.REPLACE, None, 1, NODES), "--total-steps"),
                       (StragglerWatch(StragglerAction.REPLACE, 1000, 0, NODES), "no spare node")):
        drive(watch, range(0, 50), {})
        [line] = drive(watch, range(50, 100), {0: 3.0})
        assert why in line and watch.freeze()[0].action == "reported"
