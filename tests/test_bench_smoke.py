"""The benchmarks still run (tiny sizes): a benchmark that rots silently reports nothing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    ("module", "args", "expect"),
    [
        ("bench.scan_throughput", ["--size-mb", "0.2", "--re-size-mb", "0.05", "--runs", "1", "--no-install"], "ratio"),
        ("bench.scan_memory", ["--size-mb", "8", "--line-mb", "3"], "peak RSS"),
        ("bench.packed_throughput", ["--size-mb", "0.5", "--runs", "1"], "ratio .gz / plain"),
        ("bench.corpus_accuracy", [], "fatal category accuracy"),
        ("bench.label_agreement", [], "labellers agree"),
        ("bench.unknown_wording", [], "with the vocabulary"),
        ("bench.report_size", ["--attempts", "10", "--faults", "100"], "ratio"),
        ("bench.straggler_detection", ["--steps", "60", "--trials", "2", "--healthy-steps", "300"], "ratio"),
        ("bench.auto_timing", ["--rounds", "2", "--steps", "2"], "of the untimed step"),
        ("bench.peer_restore", ["--size-mb", "8", "--repeats", "1", "--steps", "12", "--every", "2", "--rounds", "1",
                                "--width", "64"], "for the lost ranks"),
    ],
)
def test_benchmark_runs(module: str, args: list[str], expect: str, tmp_path: Path) -> None:
    no_dir = ("bench.corpus_accuracy", "bench.label_agreement", "bench.unknown_wording", "bench.auto_timing")
    extra = ["--dir", str(tmp_path)] if module not in no_dir else []
    done = subprocess.run(
        [sys.executable, "-m", module, *args, *extra],
        cwd=ROOT, capture_output=True, text=True, timeout=240, check=False,
    )
    assert done.returncode == 0, done.stderr
    assert expect in done.stdout


@pytest.mark.parametrize("module", ["bench.scan_throughput", "bench.scan_memory", "bench.report_size"])
def test_a_missing_dir_is_refused_in_one_line(module: str, tmp_path: Path) -> None:
    missing = tmp_path / "not-there"
    done = subprocess.run(
        [sys.executable, "-m", module, "--dir", str(missing)],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )
    assert done.returncode == 2
    assert f"{missing}: not an existing directory" in done.stderr
    assert "Traceback" not in done.stderr
    assert not missing.exists()
