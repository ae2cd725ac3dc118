"""What reading a compressed log costs: ``kcover explain log.gz`` against the same log uncompressed.

One synthetic log (``--size-mb`` of text, 99.9% benign lines, as in
:mod:`bench.scan_throughput`) is written plain and gzip-compressed (level 6,
what ``gzip`` and the kubelet use).  Three commands read it, each pinned to one
core and timed end to end in the same run:

- ``kcover explain log`` (the baseline: no decompression);
- ``kcover explain log.gz`` (decompressed in the process, :mod:`kcover.collect.packed`);
- ``gzip -dc log.gz | kcover explain`` (what a user ran before; both ends on the same core).

The figures are MB/s of uncompressed text and the ratios of the first to the
others: how much of the plain speed a compressed log keeps, and how it
compares with decompressing outside.  The verdicts of all three must agree.

    python -m bench.packed_throughput [--size-mb 100] [--runs 2] [--dir DIR]
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.args import existing_dir
from bench.logdata import write_log


def _pin() -> list[str]:
    return ["taskset", "-c", "0"] if shutil.which("taskset") else []


def timed(command: list[str], runs: int, *, shell: bool = False) -> tuple[float, str]:
    """Best wall-clock seconds of ``runs`` runs, and the verdict's category (kcover's ``--json``)."""
    best, category = float("inf"), ""
    for _ in range(runs):
        start = time.perf_counter()
        done = subprocess.run(command if not shell else ["bash", "-c", command[0]],
                              capture_output=True, text=True, check=False)
        best = min(best, time.perf_counter() - start)
        if done.returncode not in (0, 1):
            sys.exit(f"{command[:6]} failed ({done.returncode}): {done.stderr[-500:]}")
        category = str(json.loads(done.stdout)["verdict"].get("category"))
    return best, category


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size-mb", type=float, default=100)
    parser.add_argument("--runs", type=int, default=2, help="best of this many runs of each command (≥ 1)")
    parser.add_argument("--dir", type=existing_dir, default=None, help="where to write the test logs")
    args = parser.parse_args()
    if args.runs < 1 or args.size_mb <= 0:
        parser.error("--runs must be ≥ 1 and --size-mb > 0")
    kcover = [*_pin(), sys.executable, "-m", "kcover", "explain", "--json"]
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        plain = Path(folder) / "job.log"
        write_log(plain, int(args.size_mb * 1_000_000))
        packed = Path(folder) / "job.log.gz"
        with plain.open("rb") as source, gzip.open(packed, "wb", compresslevel=6) as target:
            shutil.copyfileobj(source, target, 1 << 20)
        megabytes = plain.stat().st_size / 1e6
        base, want = timed([*kcover, str(plain)], args.runs)
        inside, got_inside = timed([*kcover, str(packed)], args.runs)
        pin = " ".join(_pin())
        piped_command = f"{pin} gzip -dc {packed} | {' '.join(kcover)}"
        outside, got_outside = timed([piped_command], args.runs, shell=True)
    if not want == got_inside == got_outside:
        sys.exit(f"verdicts differ: plain {want}, .gz {got_inside}, gzip -dc | {got_outside}")
    print(f"{megabytes:.0f} MB of text ({packed.name}: gzip level 6), one core, verdict {want} in all three")
    print(f"kcover explain job.log              {megabytes / base:7.1f} MB/s")
    print(f"kcover explain job.log.gz           {megabytes / inside:7.1f} MB/s")
    print(f"gzip -dc job.log.gz | kcover explain {megabytes / outside:6.1f} MB/s")
    print(f"ratio .gz / plain = {base / inside:.2f}; ratio .gz / (gzip -dc |) = {outside / inside:.2f}")


if __name__ == "__main__":
    main()
