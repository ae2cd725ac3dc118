"""Output throughput of ``kcover run``: a rank writing as fast as it can, against a plain pipe, same run.

Each of ``--ranks`` workers writes ``--megabytes`` MB of training-log lines
(``--lines-per-write`` lines per ``write``: 1 is a ``print`` per line, unbuffered
as ``kcover run`` makes it; 100 is a logger that writes in batches, the harder
case for the reader) and times its own writing.  Baseline: the same workers with their stdout read by a plain reader
that discards it (the floor the OS and Python set).  Then the same workers under
``kcover run --quiet``, which logs every line to disk, classifies it and reads
progress.  A slow reader shows up as the writer blocking in ``write()``, so the
figure is baseline writer time ÷ writer time under kcover; target ≥ 0.8.

    python -m bench.launcher_throughput [--megabytes 50] [--ranks 1] [--lines-per-write 1 100] [--trials 3]
"""

from __future__ import annotations

import argparse
import os
import selectors
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

WORKER = Path(__file__).parent / "workers" / "firehose.py"
TARGET = 0.8


def writer_seconds(folder: Path, ranks: int) -> float:
    """The slowest rank's own writing time."""
    return max(float((folder / f"rank{rank}.seconds").read_text()) for rank in range(ranks))


def plain_pipe(env: dict[str, str], ranks: int, folder: Path) -> float:
    env = {**env, "BENCH_OUT": str(folder), "PYTHONUNBUFFERED": "1"}
    workers = [subprocess.Popen([sys.executable, str(WORKER)], stdout=subprocess.PIPE, env={**env, "RANK": str(r)})
               for r in range(ranks)]
    selector = selectors.DefaultSelector()
    for worker in workers:
        assert worker.stdout is not None
        selector.register(worker.stdout.fileno(), selectors.EVENT_READ)
    while selector.get_map():
        for key, _ in selector.select():
            if not os.read(key.fd, 1 << 20):
                selector.unregister(key.fd)
    for worker in workers:
        worker.wait()
    return writer_seconds(folder, ranks)


def under_kcover(env: dict[str, str], ranks: int, folder: Path) -> float:
    env = {**env, "BENCH_OUT": str(folder)}
    subprocess.run(
        [sys.executable, "-m", "kcover", "run", "--quiet", "--max-restarts", "0", "--state-dir", str(folder / "state"),
         "--nproc-per-node", str(ranks), "--", sys.executable, str(WORKER)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, timeout=600,
    )
    logged = sum(log.stat().st_size for log in (folder / "state").glob("runs/*/attempt-1/rank*.log"))
    expected = float(env["MEGABYTES"]) * 1e6 * ranks
    if logged < expected:
        raise SystemExit(f"kcover logged only {logged} bytes of {expected:.0f}")
    return writer_seconds(folder, ranks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--megabytes", type=float, default=50.0)
    parser.add_argument("--ranks", type=int, default=1)
    parser.add_argument("--lines-per-write", type=int, nargs="+", default=[1, 100])
    parser.add_argument("--trials", type=int, default=3)
    args = parser.parse_args()
    for per_write in args.lines_per_write:
        env = {**os.environ, "MEGABYTES": str(args.megabytes), "LINES_PER_WRITE": str(per_write)}
        base, kcover = measure(env, args.ranks, args.trials)
        total = args.megabytes * args.ranks
        print(f"{args.ranks} rank(s) × {args.megabytes:.0f} MB, {per_write} line(s) per write, median of "
              f"{args.trials}: plain pipe {base:.2f} s ({total / base:.0f} MB/s), kcover run {kcover:.2f} s "
              f"({total / kcover:.0f} MB/s); throughput ratio kcover/plain pipe {base / kcover:.2f} "
              f"(target >= {TARGET})")


def measure(env: dict[str, str], ranks: int, trials: int) -> tuple[float, float]:
    """Median writer seconds into a plain pipe and under kcover, trials interleaved."""
    plain, ours = [], []
    for _ in range(trials):
        with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
            plain.append(plain_pipe(env, ranks, Path(a)))
            ours.append(under_kcover(env, ranks, Path(b)))
    return statistics.median(plain), statistics.median(ours)


if __name__ == "__main__":
    main()
