"""Straggler detection: how fast a slowed rank is flagged, false flags on a healthy uneven job, timing overhead.

One run measures the test workload (``bench/workers/timed_steps.py``: 4 gloo ranks under ``kcover run``,
compute timed with ``kcover.timed``, rank 0 doing 30% extra every 10th step) and then, at exactly that
workload's noise:

- **detection**: the measured healthy steps are replayed into the detector (rows drawn at random, keeping
  each step's phase of the 10-step cycle) with one rank slowed by 10%, 20%, 50% from step 100; steps
  from the onset until it is flagged (median and worst over the trials; target ≤ 30 for 20%).  With
  ``--live``, a real ``kcover run --inject slow@rank2:factor=1.2:step=40`` as well;
- **false positives**: 2,000 replayed steps of the healthy uneven job per trial (target 0 flags);
- **overhead**: the cost of ``with kcover.timed(step):`` (enter, exit, one pipe write), as a ratio to the
  workload's measured step time, the baseline from the same run (target ≤ 0.5%); and an A/B of the
  workload's own step loop with and without the timing;
- **completion** (``--completion``): wall time of a 2-node job of ``--completion-steps`` steps with one rank
  throttled 1.5x from step 30, with ``--straggler-action replace`` and one spare node vs reporting only
  (the job as it would run without kcover's action).

    python -m bench.straggler_detection [--steps 200] [--trials 20] [--live] [--completion]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.args import existing_dir
from kcover import sdk
from kcover.decide.straggler import StragglerDetector

WORKER = Path(__file__).parent / "workers" / "timed_steps.py"
RANKS = 4
ONSET = 100
Rows = list[list[float]]


def measure_workload(steps: int, folder: Path) -> Rows:
    """Run the workload under ``kcover run``; each step's compute seconds per rank."""
    state = folder / "measure"
    subprocess.run([sys.executable, "-m", "kcover", "run", "--quiet", "--state-dir", str(state), "--nnodes",
                    str(RANKS), "--", sys.executable, str(WORKER)], env={**os.environ, "STEPS": str(steps)},
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600)
    [attempt] = (state / "runs").glob("*/attempt-1")
    per_rank = []
    for rank in range(RANKS):
        lines = (attempt / f"rank{rank}.log").read_text().splitlines()
        per_rank.append({int(w[1]): float(w[2]) for w in (line.split() for line in lines) if w[:1] == ["time"]})
    common = sorted(set.intersection(*(set(times) for times in per_rank)))
    return [[per_rank[rank][step] for rank in range(RANKS)] for step in common[5:]]  # start-up steps left out


def replay(rows: Rows, steps: int, rng: random.Random, slow_rank: int | None = None, factor: float = 1.0,
           onset: int = ONSET) -> tuple[int | None, int]:
    """Feed ``steps`` drawn rows (same phase of the 10-step cycle); steps to flag ``slow_rank`` and other flags."""
    by_phase = {phase: rows[phase::10] for phase in range(10)}
    detector = StragglerDetector()
    flagged: set[int] = set()
    for step in range(steps):
        row = rng.choice(by_phase[step % 10])
        for rank, seconds in enumerate(row):
            detector.observe(rank, step, seconds * (factor if rank == slow_rank and step >= onset else 1.0))
        now = {s.rank for s in detector.stragglers()}
        if slow_rank is not None and slow_rank in now:
            return step - onset + 1, len(flagged - {slow_rank})
        flagged |= now
    return None, len(flagged)


def timing_cost(calls: int) -> float:
    """Seconds per ``with kcover.timed(step):`` with the pipe read by a thread, as under ``kcover run``."""
    read, write = os.pipe()
    drained = threading.Thread(target=lambda: [None for _ in iter(lambda: os.read(read, 65536), b"")], daemon=True)
    drained.start()
    os.environ[sdk._FD_VARIABLE] = str(write)
    try:
        began = time.perf_counter()
        for step in range(calls):
            with sdk.timed(step):
                pass
        cost = (time.perf_counter() - began) / calls
    finally:
        del os.environ[sdk._FD_VARIABLE]
        os.close(write)
        drained.join(5)
        os.close(read)
    return cost


def ab_overhead(steps: int) -> tuple[float, float]:
    """The workload's compute loop in this process, without and with the timing, interleaved: mean step seconds."""
    import torch

    torch.set_num_threads(1)
    matrix = torch.randn(32, 32)

    def step() -> None:
        for _ in range(30):
            torch.tanh(matrix @ matrix * 0.01)
            time.sleep(0.001)

    read, write = os.pipe()
    drained = threading.Thread(target=lambda: [None for _ in iter(lambda: os.read(read, 65536), b"")], daemon=True)
    drained.start()
    os.environ[sdk._FD_VARIABLE] = str(write)
    plain, timed = [], []
    try:
        for number in range(steps):
            began = time.perf_counter()
            step()
            plain.append(time.perf_counter() - began)
            began = time.perf_counter()
            with sdk.timed(number):
                step()
            timed.append(time.perf_counter() - began)
    finally:
        del os.environ[sdk._FD_VARIABLE]
        os.close(write)
        drained.join(5)
        os.close(read)
    return statistics.median(plain), statistics.median(timed)


def live_detection(folder: Path, factor: float, steps: int) -> int | None:
    """A real run with one rank throttled from step 40: steps from the injection until it was flagged."""
    done = subprocess.run([sys.executable, "-m", "kcover", "run", "--quiet", "--json", "--state-dir",
                           str(folder / f"live-{factor}"), "--nnodes", str(RANKS), "--inject",
                           f"slow@rank2:factor={factor}:step=40", "--", sys.executable, str(WORKER)],
                          env={**os.environ, "STEPS": str(steps)}, capture_output=True, text=True, timeout=600,
                          check=False)
    flagged = [s for s in json.loads(done.stdout).get("stragglers", []) if s["rank"] == 2]
    return flagged[0]["since_step"] - 40 if flagged else None


def completion(folder: Path, steps: int, action: str) -> tuple[float, int]:
    """Wall seconds of a 2-node job with rank 1 throttled 1.5x from step 30, and its restarts."""
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "kcover", "run", "--quiet", "--json", "--state-dir",
                           str(folder / f"completion-{action}"), "--nnodes", "2", "--spare-nodes", "1",
                           "--straggler-action", action, "--total-steps", str(steps), "--inject",
                           "slow@rank1:factor=1.5:step=30", "--", sys.executable, str(WORKER)],
                          env={**os.environ, "STEPS": str(steps), "RESUME": "1"}, capture_output=True, text=True,
                          timeout=1200, check=True)
    return time.monotonic() - began, int(json.loads(done.stdout)["restarts"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=200, help="steps of the measured workload")
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--healthy-steps", type=int, default=2000)
    parser.add_argument("--live", action="store_true", help="also a real throttled run (20%%)")
    parser.add_argument("--completion", action="store_true", help="also replace vs report, job completion time")
    parser.add_argument("--completion-steps", type=int, default=800)
    parser.add_argument("--dir", type=existing_dir, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as name:
        folder = Path(name)
        rows = measure_workload(args.steps, folder)
        step_seconds = statistics.median(sum(row) / len(row) for row in rows)
        report_workload(rows, step_seconds)
        report_detection(rows, args.trials)
        report_false_positives(rows, args.trials, args.healthy_steps)
        report_overhead(step_seconds)
        if args.live:
            found = live_detection(folder, 1.2, max(args.steps, 160))
            print(f"live kcover run, rank 2 throttled 1.2x from step 40: flagged after "
                  f"{'never' if found is None else found} steps")
        if args.completion:
            slow, _ = completion(folder, args.completion_steps, "report")
            fast, restarts = completion(folder, args.completion_steps, "replace")
            print(f"completion, {args.completion_steps} steps, rank 1 throttled 1.5x from step 30: reporting only "
                  f"{slow:.1f} s, replace with one spare node {fast:.1f} s ({restarts} restart), "
                  f"ratio {fast / slow:.2f}")


def report_workload(rows: Rows, step_seconds: float) -> None:
    import math

    logs = [[math.log(t) for t in row] for row in rows]
    spread = [value - statistics.median(row) for row in logs for value in row[1:]]
    noise = 1.4826 * statistics.median(abs(v - statistics.median(spread)) for v in spread)
    print(f"workload: {len(rows)} measured steps x {RANKS} ranks, median compute {step_seconds * 1000:.1f} ms, "
          f"noise (robust sigma of log time vs peers) {noise:.3f}")


def report_detection(rows: Rows, trials: int) -> None:
    rng = random.Random(17)
    for slowdown in (0.1, 0.2, 0.5):
        found = [replay(rows, ONSET + 300, rng, slow_rank=2, factor=1 + slowdown)[0] for _ in range(trials)]
        hits = sorted(f for f in found if f is not None)
        median = statistics.median(hits) if hits else None
        print(f"detection, one rank {slowdown:.0%} slower: flagged in {len(hits)}/{trials} trials, steps to flag "
              f"median {median}, worst {hits[-1] if hits else None}" + ("  (target <= 30)" if slowdown == 0.2 else ""))


def report_false_positives(rows: Rows, trials: int, steps: int) -> None:
    rng = random.Random(29)
    flags = sum(replay(rows, steps, rng)[1] for _ in range(trials))
    print(f"false positives: {flags} flags over {trials} x {steps} steps of the healthy uneven job (target 0)")


def report_overhead(step_seconds: float) -> None:
    cost = timing_cost(200_000)
    print(f"timing overhead: {cost * 1e6:.2f} us per step = {cost / step_seconds:.4%} of the {step_seconds * 1000:.1f} "
          f"ms step (baseline from the same run; target <= 0.5%), ratio {cost / step_seconds:.5f}")
    plain, timed = ab_overhead(100)
    print(f"A/B of the step loop, median step: plain {plain * 1000:.2f} ms, timed {timed * 1000:.2f} ms, "
          f"ratio {timed / plain:.4f} (noise of a loaded machine included)")


if __name__ == "__main__":
    main()
