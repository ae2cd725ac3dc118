"""Scanning throughput of ``kcover explain`` against GNU ``grep -E -f`` on the same file.

Both search a synthetic log of ``--size-mb`` megabytes (99.9% benign lines) for
the same catalog patterns (translated to ERE for grep), each pinned to one core
(``taskset -c 0``) and timed end to end, in the same run.  The figure of merit is
the ratio kcover MB/s ÷ grep MB/s (target ≥ 1.0 with Hyperscan).  The pure-``re``
fallback is measured on a smaller slice and reported the same way.

    python -m bench.scan_throughput [--size-mb 512] [--re-size-mb 32]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.ere import catalog_to_ere
from bench.logdata import write_log
from kcover.classify.rules import load_catalog_files, shipped_catalog_files


def _pin() -> list[str]:
    return ["taskset", "-c", "0"] if shutil.which("taskset") else []


def timed(command: list[str]) -> tuple[float, str]:
    """Best of two runs (the first also warms the page cache)."""
    best = float("inf")
    output = ""
    for _ in range(2):
        start = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        best = min(best, time.perf_counter() - start)
        if done.returncode not in (0, 1):
            sys.exit(f"{command[:4]} failed ({done.returncode}): {done.stderr[-500:]}")
        output = done.stdout
    return best, output


def kcover_command(path: Path, engine: str) -> list[str]:
    return [*_pin(), sys.executable, "-m", "kcover", "explain", "--json", "--engine", engine, str(path)]


def measure(path: Path, patterns: Path, engine: str) -> tuple[float, float]:
    size_mb = path.stat().st_size / 1e6
    grep_seconds, _ = timed([*_pin(), "grep", "-E", "-c", "-f", str(patterns), str(path)])
    kcover_seconds, _ = timed(kcover_command(path, engine))
    return size_mb / grep_seconds, size_mb / kcover_seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size-mb", type=int, default=512)
    parser.add_argument("--re-size-mb", type=int, default=32)
    parser.add_argument("--dir", type=Path, default=None, help="where to write the test log")
    args = parser.parse_args()
    rules = load_catalog_files(shipped_catalog_files())
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        root = Path(folder)
        patterns = root / "patterns.ere"
        patterns.write_text("\n".join(catalog_to_ere(rules)) + "\n")
        rows = []
        try:
            import hyperscan  # noqa: F401

            engines = [("hyperscan", args.size_mb), ("re", args.re_size_mb)]
        except ImportError:
            engines = [("re", args.re_size_mb)]
        for engine, size_mb in engines:
            log = root / f"scan-{size_mb}.log"
            if not log.exists():
                write_log(log, size_mb * 1_000_000)
            grep_rate, kcover_rate = measure(log, patterns, engine)
            rows.append((engine, size_mb, grep_rate, kcover_rate))
            log.unlink()
    print(f"{len(catalog_to_ere(rules))} patterns, one core each")
    print(f"{'engine':10} {'MB':>6} {'grep MB/s':>10} {'kcover MB/s':>12} {'ratio':>7}")
    for engine, size_mb, grep_rate, kcover_rate in rows:
        print(f"{engine:10} {size_mb:6d} {grep_rate:10.1f} {kcover_rate:12.1f} {kcover_rate / grep_rate:7.2f}")


if __name__ == "__main__":
    main()
