"""A run of 1,000 attempts and 100,000 faults: the report stays under 5 MB, builds fast and opens in under 2 s."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from bench.report_size import open_seconds, read_rows, synthetic_history
from tests.runreport.conftest import dump_dom

from kcover.runreport.build import build_report


@pytest.fixture(scope="module")
def huge(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, float, float]:
    """The report of the synthetic run, its build time and the baseline (reading the rows)."""
    folder = tmp_path_factory.mktemp("huge")
    database = folder / "kcover.db"
    synthetic_history(database, attempts=1000, faults=100_000, samples=200)
    baseline = read_rows(database)
    began = time.perf_counter()
    report = build_report(database, 1, folder / "report.html")[0]
    return report, time.perf_counter() - began, baseline


def test_a_huge_run_is_aggregated_small_and_fast(huge: tuple[Path, float, float]) -> None:
    report, seconds, baseline = huge
    size = report.stat().st_size
    assert size < 5_000_000, size
    assert seconds < max(10.0, 5 * baseline), (seconds, baseline)
    page = report.read_text()
    assert "100,000 faults: more than 2,000" in page and "aggregated" in page
    assert len(re.findall(r'class="fault root"', page)) == 1000  # every failure's root cause on its own
    assert len(re.findall(r'class="fault ', page)) <= 3000
    assert "900 more failures, by root cause" in page


def test_the_huge_report_opens_in_under_two_seconds(huge: tuple[Path, float, float], chromium: str, profile: str,
                                                    tmp_path: Path) -> None:
    report = huge[0]
    blank = tmp_path / "blank.html"
    blank.write_text("<!DOCTYPE html><title>blank</title>")
    own = min((open_seconds(report, tmp_path) or 0) - (open_seconds(blank, tmp_path) or 0) for _ in range(2))
    assert own < 2.0, f"the page took {own:.2f} s more than a blank one"
    dom = dump_dom(chromium, profile, report)
    assert 'id="ettr">0.50<' in dom and dom.count('class="lane ') == 9
