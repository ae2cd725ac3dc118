"""An unexpected exception inside the supervision loop: the workers are stopped and the run still ends in a result.

The exception comes from a real component: a :class:`~kcover.launcher.reporting.Reporter`
(the demo ships one) that raises, at launch or on the first progress report,
while real workers run.  The run must end ``failed`` with the reason, its
``--json`` document must still be made, and no worker may outlive it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from kcover.launcher.reporting import run_document
from kcover.launcher.spec import RunSpec
from kcover.launcher.supervisor import Supervisor

WORKERS = Path(__file__).parent / "workers"


class ExplodingReporter:
    """Raises on the first event of kind ``on`` (``progress`` for a progress report)."""

    def __init__(self, on: str) -> None:
        self.on = on

    def event(self, kind: str, text: str) -> None:
        if kind == self.on:
            raise RuntimeError(f"reporter exploded on {kind}")

    def progress(self, rank: int, step: int) -> None:
        self.event("progress", str(step))


def live_workers() -> list[psutil.Process]:
    """Workers still running: as kcover made this process a subreaper, even escaped ones are its descendants."""
    found = []
    for process in psutil.Process().children(recursive=True):
        try:
            if process.status() != psutil.STATUS_ZOMBIE and "steps_forever.py" in " ".join(process.cmdline()):
                found.append(process)
        except psutil.Error:
            continue
    return found


@pytest.mark.parametrize("on", ["start", "progress"])
def test_an_exception_in_the_loop_stops_the_workers_and_still_gives_a_result(
        tmp_path: Path, on: str) -> None:
    spec = RunSpec(command=(sys.executable, str(WORKERS / "steps_forever.py")), nproc_per_node=2,
                   state_dir=tmp_path / "state", grace_period=1.0, echo=False)
    result = Supervisor(spec, reporter=ExplodingReporter(on)).run()
    assert result.status == "failed"
    assert result.reason == f"kcover itself failed: RuntimeError: reporter exploded on {on}"
    assert result.exit_code == 1
    assert json.loads(json.dumps(run_document(result)))["status"] == "failed"
    assert live_workers() == []


def test_workers_that_cannot_start_again_end_the_run_failed_not_as_a_usage_error(tmp_path: Path) -> None:
    program = tmp_path / "train.sh"
    program.write_text('#!/bin/sh\nrm -f "$0"\necho "NCCL error: unhandled system error" >&2\nexit 1\n')
    program.chmod(0o755)
    done = subprocess.run([sys.executable, "-m", "kcover", "run", "--json", "--quiet", "--backoff", "0",
                           "--state-dir", str(tmp_path / "state"), "--", str(program)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 1, done.stderr[-2000:]  # before: 2, a usage error, no document
    document = json.loads(done.stdout)
    assert document["status"] == "failed"
    assert "cannot start the workers again" in document["reason"]
    assert len(document["attempts"]) == 2
