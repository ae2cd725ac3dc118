"""The checkpoint benchmark still runs (tiny state): a benchmark that rots silently reports nothing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_checkpoint_benchmark_runs(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "bench.checkpoint_speed", "--size-gb", "0.02", "--dir", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    for row in ("save blocking, steady state", "persist throughput", "restore from shm into the model",
                "peak extra RSS", "device→host snapshot"):
        assert row in done.stdout
    assert not list(tmp_path.iterdir())  # the benchmark removes what it wrote
