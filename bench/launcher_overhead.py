"""Supervisor overhead: CPU and memory of ``kcover run`` while 8 workers log 10,000 lines/s in all.

The kcover process is sampled with psutil while the job runs (its own CPU time,
children excluded, and its RSS).  The baseline, from the same run, is the CPU the
8 workers spend producing those lines.  Targets: kcover ≤ 5% of one core, RSS ≤ 100 MB.

    python -m bench.launcher_overhead [--seconds 10] [--lines-per-second 10000]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

WORKER = Path(__file__).parent / "workers" / "chatty.py"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--lines-per-second", type=float, default=10_000.0)
    parser.add_argument("--nproc", type=int, default=8)
    args = parser.parse_args()
    env = {**os.environ, "LINES_PER_SECOND": str(args.lines_per_second / args.nproc),
           "SECONDS_TO_RUN": str(args.seconds)}
    with tempfile.TemporaryDirectory() as folder:
        process = subprocess.Popen(
            [sys.executable, "-m", "kcover", "run", "--quiet", "--state-dir", folder, "--nproc-per-node",
             str(args.nproc), "--", sys.executable, str(WORKER)],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        me = psutil.Process(process.pid)
        workers = started_workers(me, args.nproc)
        time.sleep(1.0)  # start-up (imports, catalog) is not steady-state overhead
        cpu_start = me.cpu_times()
        worker_start = {pid: p.cpu_times() for pid, p in workers.items()}
        began = time.monotonic()
        peak_rss = 0
        cpu_end, worker_end = cpu_start, dict(worker_start)
        while process.poll() is None and time.monotonic() - began < args.seconds - 1.5:
            peak_rss = max(peak_rss, me.memory_info().rss)
            cpu_end = me.cpu_times()
            for pid, worker in workers.items():
                with contextlib.suppress(psutil.Error):
                    worker_end[pid] = worker.cpu_times()
            time.sleep(0.2)
        window = time.monotonic() - began
        process.wait(timeout=120)
        lines = sum(len(log.read_bytes().splitlines()) for log in Path(folder).glob("runs/*/attempt-1/rank*.log"))
    kcover_cpu = (cpu_end.user + cpu_end.system) - (cpu_start.user + cpu_start.system)
    worker_cpu = sum((worker_end[p].user + worker_end[p].system) - (worker_start[p].user + worker_start[p].system)
                     for p in workers)
    print(f"{args.nproc} workers, {lines} lines logged in {args.seconds:.0f} s ({lines / args.seconds:,.0f} lines/s)")
    print(f"kcover CPU {kcover_cpu / window * 100:5.1f}% of one core (target <= 5%);"
          f" workers {worker_cpu / window * 100:5.1f}%; ratio kcover/workers {kcover_cpu / max(worker_cpu, 1e-9):.2f}")
    print(f"kcover peak RSS {peak_rss / 2**20:.1f} MB (target <= 100 MB)")


def started_workers(kcover: psutil.Process, count: int) -> dict[int, psutil.Process]:
    """kcover's worker processes, once all ``count`` started (a loaded machine may take seconds)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with contextlib.suppress(psutil.Error):
            found = {p.pid: p for p in kcover.children() if str(WORKER) in " ".join(p.cmdline())}
            if len(found) == count:
                return found
        time.sleep(0.05)
    raise SystemExit(f"kcover did not start {count} workers within 60 s")


if __name__ == "__main__":
    main()
