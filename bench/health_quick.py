"""Benchmark: wall time of the quick health suite on this machine, with its figures.

Runs ``kcover check --json`` (the quick suite, checkpoint path = a temp dir) as a
user would, three times, and prints the median wall time against the target
(≤ 10 s on a CPU-only machine, ≤ 60 s on an 8-GPU node) plus the measured
storage and all-reduce figures of the median run.  ``python -m bench.health_quick``.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time


def main(runs: int = 3) -> None:
    walls, documents = [], []
    with tempfile.TemporaryDirectory(prefix="kcover-bench-") as folder:
        for _ in range(runs):
            started = time.perf_counter()
            done = subprocess.run(
                [sys.executable, "-m", "kcover", "check", "--json", "--checkpoint-dir", folder],
                capture_output=True,
                text=True,
                check=False,
            )
            walls.append(time.perf_counter() - started)
            documents.append(json.loads(done.stdout))
    median = statistics.median(walls)
    document = documents[walls.index(median)]
    print(
        f"quick suite wall time: median {median:.2f} s of {runs} runs (min {min(walls):.2f}, max {max(walls):.2f});"
        f" target ≤ 10 s CPU-only: {'met' if median <= 10 else 'MISSED'}"
    )
    for check in document["checks"]:
        if check["status"] != "skipped":
            print(
                f"  {check['name']:<22} {check['status']:<5} {check['value']} {check['unit']}  ({check['seconds']} s)"
            )
    skipped = [c["name"] for c in document["checks"] if c["status"] == "skipped"]
    print(f"  skipped here: {', '.join(skipped)}")


if __name__ == "__main__":
    main()
