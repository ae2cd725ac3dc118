"""Under ``kcover run``: a rank killed mid-training, every rank resumes from the same step, mostly from memory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.checkpoint.conftest import WORKERS


def test_crash_then_restart_resumes_all_ranks_from_one_step(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "kcover", "run", "--json", "--quiet", "--state-dir", str(tmp_path / "state"),
               "--grace-period", "5", "--nproc-per-node", "2", "--inject", "crash@rank1:step=8", "--",
               sys.executable, str(WORKERS / "train.py")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=150, check=False, env=dict(os.environ))
    document = json.loads(done.stdout)
    assert done.returncode == 0, (document, done.stderr[-2000:])
    assert document["restarts"] == 1
    logs = [(Path(document["run_dir"]) / "attempt-2" / f"rank{r}.log").read_text() for r in (0, 1)]
    resumed = [next(line for line in log.splitlines() if line.startswith("resumed")) for log in logs]
    steps = {int(line.split()[2]) for line in resumed}
    assert len(steps) == 1 and 5 <= steps.pop() <= 9  # one step for all ranks, at least the last persisted one
    assert any(" from memory " in line for line in resumed), resumed
    assert document["attempts"][0]["timings"]["productive_seconds"] > 0  # checkpoints reached ETTR
    assert not list((tmp_path / "state" / "checkpoints").rglob("*.tmp"))
