"""Scanning throughput of ``kcover explain`` against GNU ``grep -E -f`` and ripgrep on the same file.

All three search a synthetic log of ``--size-mb`` megabytes (99.9% benign
lines, 300 MB by default) for the same catalog patterns (translated to ERE for
grep, run in the C locale, to Rust regex for ``rg -j1 -c -f``: :mod:`bench.ripgrep`), each pinned to
one core (``taskset -c 0``) and timed end to end, in the same run.  The figures
of merit are the ratios kcover MB/s ÷ grep MB/s and kcover MB/s ÷ rg MB/s
(target ≥ 1.0 for both with Hyperscan).  The pure-``re`` fallback is measured
on a smaller slice and reported the same way.

ripgrep is taken from ``PATH``, or installed from Debian's packages when
running as root with ``apt-get`` (not with ``--no-install``); otherwise its
column says why it was skipped.

    python -m bench.scan_throughput [--size-mb 300] [--re-size-mb 32] [--no-install]
"""

from __future__ import annotations

import argparse
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.args import existing_dir
from bench.ere import catalog_to_ere
from bench.logdata import write_log
from bench.ripgrep import SIZE_LIMIT, catalog_to_rust, find_ripgrep, usable
from kcover.classify.rules import Rule, load_catalog_files, shipped_catalog_files


def _pin() -> list[str]:
    return ["taskset", "-c", "0"] if shutil.which("taskset") else []


@dataclass(frozen=True)
class Timing:
    """Best of two runs: wall-clock seconds (the figure of merit) and CPU seconds (robust to a loaded machine)."""

    wall: float
    cpu: float


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(command: list[str], runs: int) -> Timing:
    """Best of ``runs`` runs (the first also warms the page cache)."""
    wall = cpu = float("inf")
    for _ in range(runs):
        start, used = time.perf_counter(), _children_cpu()
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        wall, cpu = min(wall, time.perf_counter() - start), min(cpu, _children_cpu() - used)
        if done.returncode not in (0, 1):
            sys.exit(f"{command[:4]} failed ({done.returncode}): {done.stderr[-500:]}")
    return Timing(wall, cpu)


@dataclass(frozen=True)
class Rates:
    """How long each tool took on one file (``rg`` None when skipped)."""

    grep: Timing
    rg: Timing | None
    kcover: Timing


def kcover_command(path: Path, engine: str) -> list[str]:
    return [*_pin(), sys.executable, "-m", "kcover", "explain", "--json", "--engine", engine, str(path)]


def measure(path: Path, ere: Path, engine: str, rust: tuple[str, Path] | None, runs: int) -> Rates:
    """Times of grep, rg (when there) and kcover on ``path``, one after the other in this run."""
    # grep in the C locale, on bytes as Hyperscan and rg scan: in a UTF-8 locale it is 60 times slower with
    # these patterns (0.2 MB/s), and a bench run would take an hour.
    grep = timed(["env", "LC_ALL=C", *_pin(), "grep", "-E", "-c", "-f", str(ere), str(path)], runs)
    rg = None
    if rust is not None:
        rg = timed([*_pin(), rust[0], "--no-config", *SIZE_LIMIT, "-j1", "-c", "-f", str(rust[1]), str(path)], runs)
    return Rates(grep, rg, timed(kcover_command(path, engine), runs))


def _ratio(kcover: float, other: float | None) -> str:
    """kcover's speed over the other tool's, from their seconds (``-`` when the other did not run)."""
    return f"{other / kcover:7.2f}" if other is not None else f"{'-':>7}"


def ripgrep_patterns(root: Path, rules: list[Rule], install: bool) -> tuple[tuple[str, Path] | None, str]:
    """rg and its pattern file, or ``None``; and a line saying what was compared (or why rg was skipped)."""
    rg, said = find_ripgrep(install)
    if rg is None:
        return None, said
    translated = catalog_to_rust(rules)
    kept, refused = usable(rg, translated.patterns, root)
    patterns = root / "patterns.rg"
    patterns.write_text("\n".join(kept) + "\n")
    note = f"{said}; " if said else ""
    return (rg, patterns), (f"ripgrep: {note}{len(kept)} patterns, {translated.lookaround_dropped} without "
                            f"their look-around (a superset), {refused} refused by rg and left out")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size-mb", "--megabytes", dest="size_mb", type=float, default=300)
    parser.add_argument("--re-size-mb", type=float, default=32)
    parser.add_argument("--dir", type=existing_dir, default=None, help="where to write the test log")
    parser.add_argument("--no-install", action="store_true", help="never apt-get install ripgrep")
    parser.add_argument("--runs", type=int, default=2, help="best of this many runs of each tool (≥ 1)")
    args = parser.parse_args()
    if args.runs < 1 or args.size_mb <= 0 or args.re_size_mb <= 0:
        parser.error("--runs must be ≥ 1 and the sizes > 0")
    rules = load_catalog_files(shipped_catalog_files())
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        root = Path(folder)
        ere = root / "patterns.ere"
        ere.write_text("\n".join(catalog_to_ere(rules)) + "\n")
        rust, rust_said = ripgrep_patterns(root, rules, install=not args.no_install)
        rows = []
        try:
            import hyperscan  # noqa: F401

            engines = [("hyperscan", args.size_mb), ("re", args.re_size_mb)]
        except ImportError:
            engines = [("re", args.re_size_mb)]
        for engine, size_mb in engines:
            log = root / f"scan-{size_mb:g}.log"
            if not log.exists():
                write_log(log, int(size_mb * 1_000_000))
            rows.append((engine, log.stat().st_size / 1e6, measure(log, ere, engine, rust, args.runs)))
            log.unlink()
    print(f"{len(catalog_to_ere(rules))} patterns, one core each")
    print(rust_said)
    print("ratio = kcover MB/s / grep MB/s, vs rg = kcover MB/s / rg MB/s (wall clock, end to end); "
          "cpu: the same from CPU seconds")
    print(f"{'engine':10} {'MB':>6} {'grep MB/s':>10} {'rg MB/s':>8} {'kcover MB/s':>12} {'ratio':>7} {'vs rg':>7} "
          f"{'cpu':>7} {'cpu rg':>7}")
    for engine, megabytes, rates in rows:
        rg_wall = rates.rg.wall if rates.rg else None
        rg_rate = f"{megabytes / rg_wall:8.1f}" if rg_wall else f"{'-':>8}"
        print(f"{engine:10} {megabytes:6.4g} {megabytes / rates.grep.wall:10.1f} {rg_rate} "
              f"{megabytes / rates.kcover.wall:12.1f} {_ratio(rates.kcover.wall, rates.grep.wall)} "
              f"{_ratio(rates.kcover.wall, rg_wall)} {_ratio(rates.kcover.cpu, rates.grep.cpu)} "
              f"{_ratio(rates.kcover.cpu, rates.rg.cpu if rates.rg else None)}")


if __name__ == "__main__":
    main()
