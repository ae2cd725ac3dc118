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

import pytest

WORKERS = Path(__file__).parent / "workers"


@pytest.mark.parametrize("on", ["start", "progress"])
def test_an_exception_in_the_loop_stops_the_workers_and_still_gives_a_result(
        tmp_path: Path, on: str) -> None:
    """In a process of its own (``workers/exploding_run.py``): the supervisor adopts and stops its process's
    children, which in pytest's would include the session's test cluster."""
    done = subprocess.run([sys.executable, str(WORKERS / "exploding_run.py"), on, str(tmp_path / "state"),
                           str(WORKERS / "steps_forever.py")], capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["status"] == "failed"
    assert result["reason"] == f"kcover itself failed: RuntimeError: reporter exploded on {on}"
    assert result["exit_code"] == 1
    assert result["document"]["status"] == "failed"
    assert result["alive"] == []


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
