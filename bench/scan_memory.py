"""Peak memory of ``kcover explain`` on a 1 GB log, on one 100 MB line, and on 1,200 distinct 900 KB lines.

Each case runs ``kcover explain --json`` in a child process and reads its peak
RSS from ``getrusage``; the baseline, measured in the same run, is the same
command on a 1 MB log (the interpreter, the catalog and the engine).  Targets:
peak RSS ≤ 150 MB on 1 GB, and the 100 MB line handled within the same bound.
The distinct-lines case (each 900 KB line flagged by the engine, none alike)
checks that the matcher's decision cache is bounded in bytes, not only in
entries: target ≤ 150 MB.

    python -m bench.scan_memory [--size-mb 1024] [--line-mb 100] [--distinct-lines 1200]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.args import existing_dir
from bench.logdata import write_log


def peak_rss_mb(path: Path) -> float:
    """Peak RSS of one ``kcover explain`` child (a fresh process each time)."""
    code = (
        "import resource, subprocess, sys;"
        "subprocess.run([sys.executable, '-m', 'kcover', 'explain', '--json', sys.argv[1]],"
        " stdout=subprocess.DEVNULL, check=False);"
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
    )
    done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True)
    return int(done.stdout.strip()) / 1024


def write_giant_line(path: Path, size_mb: int) -> None:
    with path.open("wb") as out:
        out.write(b"step 1 ok\n")
        for _ in range(size_mb):
            out.write(b"z" * 1_000_000)
        out.write(b" CUDA out of memory\nNVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.\n")


def write_distinct_lines(path: Path, count: int) -> None:
    """``count`` distinct lines of 900 KB, each with a fault near its end."""
    with path.open("wb") as out:
        for index in range(count):
            out.write(b"%d " % index + b"z" * 900_000 + b" CUDA out of memory %d\n" % index)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size-mb", type=int, default=1024)
    parser.add_argument("--line-mb", type=int, default=100)
    parser.add_argument("--distinct-lines", type=int, default=1200)
    parser.add_argument("--dir", type=existing_dir, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        root = Path(folder)
        small, big, giant = root / "small.log", root / "big.log", root / "giant.log"
        write_log(small, 1_000_000)
        baseline = peak_rss_mb(small)
        small.unlink()
        write_log(big, args.size_mb * 1_000_000)
        big_rss = peak_rss_mb(big)
        big.unlink()
        write_giant_line(giant, args.line_mb)
        giant_rss = peak_rss_mb(giant)
        giant.unlink()
        distinct = root / "distinct.log"
        write_distinct_lines(distinct, args.distinct_lines)
        distinct_rss = peak_rss_mb(distinct)
    print(f"baseline (1 MB log)        : {baseline:7.1f} MB peak RSS")
    print(f"{args.size_mb} MB log               : {big_rss:7.1f} MB peak RSS ({big_rss / baseline:.2f}x baseline;"
          f" target <= 150 MB)")
    print(f"one {args.line_mb} MB line           : {giant_rss:7.1f} MB peak RSS ({giant_rss / baseline:.2f}x baseline)")
    print(f"{args.distinct_lines} distinct 900 KB lines: {distinct_rss:7.1f} MB peak RSS"
          f" ({distinct_rss / baseline:.2f}x baseline; target <= 150 MB)")


if __name__ == "__main__":
    main()
