"""Fixtures of the report tests: a real recovered run, and headless Chromium to look at the page with."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kcover.runreport.output import browser_command, find_browser

WORKERS = Path(__file__).parent / "workers"


def kcover(*args: str, cwd: Path | None = None, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kcover", *args], capture_output=True, text=True, check=False,
                          timeout=timeout, cwd=cwd)


@pytest.fixture(scope="session")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A real ``kcover run``: 2 nodes × 2 ranks and a spare, an Xid 79 on node-1 at step 8, rank 0 hung at step 20."""
    state = tmp_path_factory.mktemp("recorded") / "state"
    done = kcover("run", "--json", "--quiet", "--state-dir", str(state), "--nnodes", "2", "--nproc-per-node", "2",
                  "--spare-nodes", "1", "--hang-timeout", "3", "--grace-period", "2",
                  "--inject", "xid79@node-1:step=8", "--inject", "hang@rank0:step=20",
                  "--", sys.executable, str(WORKERS / "train_steps.py"))
    assert done.returncode == 0, done.stderr[-3000:]
    document = json.loads(done.stdout)
    assert [a["outcome"] for a in document["attempts"]] == ["failed", "hung", "succeeded"], document["attempts"]
    return {"state": state, "doc": document, "stderr": done.stderr}


@pytest.fixture(scope="session")
def chromium() -> str:
    browser = find_browser()
    if browser is None:
        pytest.skip("headless Chromium is not installed (Debian: apt-get install chromium); the page is not opened")
    return browser


@pytest.fixture
def profile() -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="kcover-test-chromium-") as folder:
        yield folder


def dump_dom(browser: str, profile: str, page: Path) -> str:
    """The page's DOM after Chromium loaded and laid it out."""
    done = subprocess.run([*browser_command(browser, profile), "--dump-dom", page.as_uri()], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def screenshot(browser: str, profile: str, page: Path, target: Path, size: str = "1250,2000") -> None:
    done = subprocess.run([*browser_command(browser, profile), f"--screenshot={target}", f"--window-size={size}",
                           page.as_uri()], capture_output=True, text=True, timeout=120, check=False)
    assert target.is_file(), done.stderr[-2000:]


def count(pattern: str, text: str) -> int:
    return len(re.findall(pattern, text))


