"""Latencies of ``kcover run``: detection, restart (against torchrun, same run), hang detection.

- detection: a worker flushes a fatal line → kcover records the fault. Baseline: a
  plain reader of the same pipe (the floor the OS and Python set). p50/p99 over
  ``--trials`` failures.
- restart: rank 3 of 8 fails → all 8 workers of the next attempt started, for
  ``torchrun --max-restarts 1`` and ``kcover run`` on the same script; ratio ≤ 1.0 wins.
- hang: a stalled job is detected after hang-timeout + how much.

    python -m bench.launcher_latency [--trials 20]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORKERS = Path(__file__).parent / "workers"


def kcover(args: list[str], env: dict[str, str], state: Path) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-m", "kcover", "run", "--json", "--quiet", "--state-dir", str(state), *args],
        capture_output=True, text=True, env={**os.environ, **env}, check=False, timeout=600,
    )
    return dict(json.loads(done.stdout))


def detection(trials: int, root: Path) -> tuple[list[float], list[float]]:
    """kcover's latency per trial, and the plain-pipe baseline's."""
    bench = root / "detect"
    bench.mkdir()
    env = {"BENCH_DIR": str(bench), "FAIL_ATTEMPTS": str(trials)}
    document = kcover(["--nproc-per-node", "4", "--max-restarts", str(trials), "--backoff", "0",
                       "--grace-period", "1", "--", sys.executable, str(WORKERS / "fail_once.py")], env, root / "s1")
    attempts = document["attempts"]
    assert isinstance(attempts, list)
    ours = []
    for attempt in attempts[:trials]:
        wrote = float((bench / f"fail-{attempt['number'] - 1}").read_text())
        ours.append(attempt["timings"]["first_fault_epoch"] - wrote)
    floor = []
    code = ("import sys,time\nfor line in sys.stdin:\n    print(time.time()-float(line.split()[0]), flush=True)\n")
    for _ in range(trials):
        reader = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  text=True)
        assert reader.stdin is not None and reader.stdout is not None
        reader.stdin.write(f"{time.time()} RuntimeError: CUDA error\n")
        reader.stdin.flush()
        floor.append(float(reader.stdout.readline()))
        reader.stdin.close()
        reader.wait()
    return ours, floor


def restart(root: Path, nproc: int = 8) -> tuple[float, float]:
    """Seconds from rank 3's failure to all workers of the next attempt started: (kcover, torchrun)."""
    results = []
    for name in ("kcover", "torchrun"):
        bench = root / f"restart-{name}"
        bench.mkdir()
        env = {"BENCH_DIR": str(bench), "FAIL_ATTEMPTS": "1"}
        script = [sys.executable, str(WORKERS / "fail_once.py")]
        if name == "kcover":
            kcover(["--nproc-per-node", str(nproc), "--grace-period", "5", "--", *script], env, root / "s2")
        else:
            torchrun = shutil.which("torchrun") or str(Path(sys.executable).parent / "torchrun")
            subprocess.run([torchrun, "--nproc-per-node", str(nproc), "--max-restarts", "1", "--monitor-interval",
                            "0.1", "--standalone", str(WORKERS / "fail_once.py")],
                           env={**os.environ, **env}, capture_output=True, check=False, timeout=300)
        failed = float((bench / "fail-0").read_text())
        restarted = max(float((bench / f"start-1-{rank}").read_text()) for rank in range(nproc))
        results.append(restarted - failed)
    return results[0], results[1]


def hang(root: Path, timeout: float = 3.0) -> float:
    """Seconds after the hang timeout at which kcover declared the hang."""
    script = WORKERS.parent.parent / "tests" / "launcher" / "workers" / "hang_allreduce.py"
    document = kcover(["--nproc-per-node", "2", "--hang-timeout", str(timeout), "--max-restarts", "0",
                       "--", sys.executable, str(script)], {}, root / "s3")
    attempts = document["attempts"]
    assert isinstance(attempts, list)
    timings = attempts[0]["timings"]
    return float(timings["first_fault_seconds"] - timings["first_progress_seconds"]) - timeout


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--nproc", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        ours, floor = detection(args.trials, root)
        ours_restart, torchrun_restart = restart(root, args.nproc)
        late = hang(root)
    ms = 1000
    print(f"detection latency  p50 {statistics.median(ours) * ms:6.1f} ms  p99 {percentile(ours, 0.99) * ms:6.1f} ms"
          f"   (plain pipe reader p99 {percentile(floor, 0.99) * ms:.1f} ms; target p99 <= 100 ms)")
    print(f"restart latency    kcover {ours_restart:.2f} s  torchrun {torchrun_restart:.2f} s"
          f"  ratio {ours_restart / torchrun_restart:.2f}"
          f"  (failure -> all {args.nproc} workers relaunched; target <= 1.0)")
    print(f"hang detection     {late:+.2f} s after the hang timeout (target <= +5 s; NCCL's default timeout is 600 s)")


if __name__ == "__main__":
    main()
