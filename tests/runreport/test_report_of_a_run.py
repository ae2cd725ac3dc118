"""A report built from a real recovered run, opened in headless Chromium and read as a person would.

The run (:func:`conftest.recorded`) loses node-1 to an injected Xid 79 and then
hangs on rank 0; the page must show a lane per node and per rank, the Xid as
the root cause on node-1's lane, the hang, the checkpoints, the verdicts with
their remediation, and the run's ETTR — in the DOM Chromium built, and on a
screenshot.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from tests.runreport.conftest import count, dump_dom, kcover, screenshot


def test_kcover_run_writes_the_report_in_its_run_folder_and_says_where(recorded: dict[str, Any]) -> None:
    report = Path(recorded["doc"]["run_dir"]) / "report.html"
    assert f"report: {report}" in recorded["stderr"]
    assert report.is_file()
    assert "<svg id=\"timeline\"" in report.read_text()


def test_the_page_shows_lanes_faults_and_ettr(recorded: dict[str, Any], chromium: str, profile: str,
                                              tmp_path: Path) -> None:
    target = tmp_path / "report.html"
    done = kcover("report", "--state-dir", str(recorded["state"]), "-o", str(target))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(target)
    dom = dump_dom(chromium, profile, target)
    lanes = re.findall(r'data-lane="([^"]+)"', dom)
    assert lanes[:1] == ["job"]
    assert {"node-0", "node-1 (excluded)", "node-2", "rank 0", "rank 1", "rank 2", "rank 3"} <= set(lanes)
    assert count(r'class="fault root" data-category="gpu_hardware" data-rule="xid\.79\.fallen-off-bus"', dom) == 1
    assert count(r'class="fault root" data-category="collective_timeout_hang"', dom) == 1
    ettr = float(re.search(r'<b id="ettr">([0-9.]+)</b>', dom).group(1))  # type: ignore[union-attr]
    assert abs(ettr - recorded["doc"]["ettr"]) < 0.01
    assert count(r'class="checkpoint"', dom) >= 4
    assert count(r'<rect class="attempt-bar"', dom) == 6  # 3 attempts × 2 nodes
    assert count(r'class="failure"', dom) == 2
    assert "Remediation:" in dom and "GPU has fallen off the bus" in dom
    assert 'id="excluded">node-1<' in dom
    assert count(r'class="progress-line"', dom) == 3


def test_the_xid_sits_on_node_1s_lane_and_redone_work_shows(recorded: dict[str, Any]) -> None:
    page = (Path(recorded["doc"]["run_dir"]) / "report.html").read_text()
    lane = re.search(r'data-lane="node-1 \(excluded\)"><rect x="[\d.]+" y="([\d.]+)" width="[\d.]+" height="([\d.]+)"',
                     page)
    assert lane is not None
    top, height = float(lane.group(1)), float(lane.group(2))
    root = re.search(r'class="fault root" data-category="gpu_hardware"[^>]*><path d="M[\d.]+ ([\d.]+)', page)
    assert root is not None
    assert top <= float(root.group(1)) + 8 <= top + height  # the diamond's centre is inside node-1's lane
    assert "steps redone" in page  # the hung attempt restarts below its last step
    assert re.search(r'class="lost-kind detection"', page) and re.search(r'class="lost-kind backoff"', page)


def test_a_screenshot_and_a_png_of_the_timeline(recorded: dict[str, Any], chromium: str, profile: str,
                                                tmp_path: Path) -> None:
    target = tmp_path / "run.html"
    done = kcover("report", "1", "--state-dir", str(recorded["state"]), "-o", str(target), "--png")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(target), str(tmp_path / "run.png")]
    png = (tmp_path / "run.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
    shot = tmp_path / "page.png"
    screenshot(chromium, profile, target, shot)
    assert shot.read_bytes().startswith(b"\x89PNG") and shot.stat().st_size > 20_000


def test_by_default_the_report_goes_into_the_runs_folder(recorded: dict[str, Any]) -> None:
    report = Path(recorded["doc"]["run_dir"]) / "report.html"
    report.unlink()
    done = kcover("report", "--state-dir", str(recorded["state"]))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(report)
    assert report.read_text().startswith("<!DOCTYPE html>")
