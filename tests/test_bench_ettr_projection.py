"""bench.ettr_projection: the ETTR arithmetic by hand, its direction, the committed inputs, and refused inputs files."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest
from bench import ettr_projection as projection
from bench.ettr_projection import Blame, Category, InputError

ROOT = Path(__file__).resolve().parent.parent
COMMITTED = ROOT / "bench" / "recovery_inputs.json"


def committed_values() -> dict[str, float | None]:
    return {key: entry.value for key, entry in projection.load_inputs(COMMITTED).items()}


def strategy(name: str) -> projection.Strategy:
    return next(s for s in projection.STRATEGIES if s.name == name)


def test_one_category_by_hand() -> None:
    """One fault that blames no node every 1,000 s at 16,384 GPUs, recovered by pod recreation in 10 s + 2 s restore,
    a checkpoint after every 100 s of compute that blocks 10 s: each fault costs 10 + 2 + (100 + 10) / 2 = 67 s, so
    ETTR = (1 - 67 / 1000) × 100 / 110 = 0.848181..."""
    values = committed_values() | {"interruption_interval_16k": 1000.0, "kcover_pod_recreation_restart": 10.0,
                                   "torch_load_restore": 2.0, "kcover_save_blocking": 10.0}
    trace = [Category("software bug", 3, Blame.NONE)]
    got = projection.ettr(strategy("recreate"), values, 16_384, 100.0, trace)
    assert got == pytest.approx((1 - 67 / 1000) * 100 / 110)
    # twice the GPUs, twice the interruptions: 1 - 134 / 1000
    assert projection.ettr(strategy("recreate"), values, 32_768, 100.0, trace) == pytest.approx(
        (1 - 134 / 1000) * 100 / 110)


def test_a_mix_weights_each_path_by_its_count() -> None:
    """3 node faults replaced by a warm standby in 4 s, 1 hang restarted in place in 1 s after 60 + 0.5 s of hang
    detection; memory restore 0.5 s, disk restore 2 s; no save cost, 60 s checkpoints (30 s redone per fault):
    mean loss = (3 × (4 + 2 + 30) + 1 × (60.5 + 1 + 0.5 + 30)) / 4 = 50 s; one fault per 500 s → ETTR 0.9."""
    values = committed_values() | {
        "interruption_interval_16k": 500.0, "kcover_standby_restart": 4.0, "kcover_in_place_restart": 1.0,
        "kcover_memory_restore": 0.5, "torch_load_restore": 2.0, "kcover_hang_timeout": 60.0,
        "kcover_hang_detection_lag": 0.5, "kcover_save_blocking": 0.0}
    trace = [Category("faulty GPU", 3, Blame.NODE), Category("NCCL watchdog timeout", 1, Blame.HANG)]
    assert projection.ettr(strategy("in-place+standby"), values, 16_384, 60.0, trace) == pytest.approx(0.9)


def test_a_path_without_a_figure_prints_nothing_and_the_measured_ones_rank_as_expected() -> None:
    """A path with no figure yet prints nothing; with the committed figures (both measured on real nodes) the
    in-place paths beat pod recreation, and standby beats in place, at every scale and interval."""
    values = committed_values()
    assert values["kcover_in_place_restart"] is not None and values["kcover_standby_restart"] is not None
    assert projection.ettr(strategy("in-place+standby"), values | {"kcover_standby_restart": None}, 16_384,
                           300.0) is None
    for gpus in projection.SCALES:
        for _, compute in projection.intervals(6.0):
            recreate = projection.ettr(strategy("recreate"), values, gpus, compute)
            in_place = projection.ettr(strategy("in-place"), values, gpus, compute)
            standby = projection.ettr(strategy("in-place+standby"), values, gpus, compute)
            assert recreate is not None and in_place is not None and standby is not None
            assert recreate <= in_place <= standby


def test_more_frequent_checkpoints_redo_less_work() -> None:
    """Without a save cost, each shorter interval leaves less work to redo, so ETTR rises as the interval falls."""
    values = committed_values() | {"kcover_save_blocking": 0.0, "torch_save_blocking": 0.0}
    for name in ("recreate", "torchrun", "manual"):
        got = [projection.ettr(strategy(name), values, 16_384, minutes * 60.0) for minutes in (60, 30, 15, 5, 1)]
        assert all(value is not None for value in got)
        assert all(a is not None and b is not None and a < b for a, b in itertools.pairwise(got))


def test_ettr_stays_within_zero_and_one() -> None:
    values = committed_values() | {"kcover_in_place_restart": 2.0, "kcover_standby_restart": 2.0}
    for s in projection.STRATEGIES:
        for gpus in (*projection.SCALES, 10_000_000):
            for _, compute in projection.intervals(6.0):
                got = projection.ettr(s, values, gpus, compute)
                assert got is not None and 0.0 <= got <= 1.0
    assert projection.ettr(strategy("manual"), values, 10_000_000, 3600.0) == 0.0


def test_every_input_a_strategy_reads_is_listed_and_committed() -> None:
    assert projection.strategy_keys() | {"interruption_interval_16k", "step_time"} == set(projection.INPUT_KEYS)
    assert set(committed_document()) == set(projection.INPUT_KEYS)


def test_trace_is_the_llama3_table() -> None:
    assert sum(c.count for c in projection.TRACE) == 419
    assert sum(c.count for c in projection.TRACE if c.blame is Blame.NODE) == 321


def test_runs_end_to_end_with_the_committed_inputs() -> None:
    done = subprocess.run([sys.executable, "-m", "bench.ettr_projection"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert "Llama 3 paper" in done.stdout and "bench.k8s_restart_latency" in done.stdout
    rows = [line for line in done.stdout.splitlines() if "min  " in line or "1 step" in line]
    assert len(rows) == len(projection.SCALES) * (len(projection.INTERVALS_MINUTES) + 1)
    assert not any("not measured" in row for row in rows)  # every path has its figure


def write(tmp_path: Path, document: object) -> Path:
    path = tmp_path / "inputs.json"
    path.write_text(document if isinstance(document, str) else json.dumps(document), encoding="utf-8")
    return path


def committed_document() -> dict[str, dict[str, object]]:
    return dict(json.loads(COMMITTED.read_text(encoding="utf-8")))


def with_value(key: str, value: object) -> dict[str, dict[str, object]]:
    document = committed_document()
    document[key] = document[key] | {"value": value}
    return document


@pytest.mark.parametrize(
    ("document", "key", "says"),
    [
        pytest.param({k: v for k, v in committed_document().items() if k != "nccl_timeout"}, "nccl_timeout",
                     "missing", id="missing"),
        pytest.param(with_value("torch_save_blocking", -1), "torch_save_blocking", "got -1", id="negative"),
        pytest.param(with_value("kcover_pod_recreation_restart", float("nan")), "kcover_pod_recreation_restart",
                     "got NaN", id="nan"),
        pytest.param(with_value("manual_restart", "15 min"), "manual_restart", 'got "15 min"', id="string"),
        pytest.param(with_value("step_time", True), "step_time", "got true", id="bool"),
        pytest.param(with_value("step_time", 0), "step_time", "greater than 0", id="zero-step"),
        pytest.param(with_value("torch_load_restore", None), "torch_load_restore", "got null", id="null-not-allowed"),
        pytest.param(committed_document() | {"nccl_timeout": 600}, "nccl_timeout", "an object", id="bare-number"),
    ],
)
def test_bad_inputs_are_one_line_and_exit_2(tmp_path: Path, document: object, key: str, says: str) -> None:
    path = write(tmp_path, document)
    with pytest.raises(InputError, match=key):
        projection.load_inputs(path)
    done = subprocess.run([sys.executable, "-m", "bench.ettr_projection", "--inputs", str(path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr
    assert str(path) in lines[0] and f"'{key}'" in lines[0] and says in lines[0]


@pytest.mark.parametrize("text", ["{not json", "[1, 2]"], ids=["not-json", "not-an-object"])
def test_unusable_files_exit_2(tmp_path: Path, text: str) -> None:
    path = write(tmp_path, text)
    assert projection.main(["--inputs", str(path)]) == 2
    assert projection.main(["--inputs", str(tmp_path / "absent.json")]) == 2


def test_another_inputs_file_is_used(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    document = with_value("kcover_in_place_restart", 2.0)
    document["kcover_in_place_restart"]["source"] = "an example"
    document["kcover_standby_restart"]["value"] = None  # a path without a figure: its column says so
    assert projection.main(["--inputs", str(write(tmp_path, document))]) == 0
    out = capsys.readouterr().out
    assert "an example" in out
    rows = [line for line in out.splitlines() if "min  " in line]
    assert rows and all(row.count("not measured") == 1 for row in rows)
