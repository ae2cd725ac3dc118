"""The check framework: selection, budgets (a hang is killed), errors, config validation, CLI, pairwise."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
from typer.testing import CliRunner

from kcover.cli.main import build_app
from kcover.health import registry
from kcover.health.config import HealthConfigError, load_config
from kcover.health.model import Outcome, Status
from kcover.health.pairwise import PairwiseSpec, find_slow_nodes, plan_first_round, plan_second_round, simulate_pairwise
from kcover.health.registry import CheckContext
from kcover.health.runner import run_checks, run_one, select_checks


class Hangs:
    def run(self, ctx: CheckContext) -> Outcome:
        os.fork() or time.sleep(3600)  # a helper too: the whole group must die
        time.sleep(3600)
        raise AssertionError("unreachable")


class Raises:
    def run(self, ctx: CheckContext) -> Outcome:
        raise RuntimeError("sensor returned garbage")


class Dies:
    def run(self, ctx: CheckContext) -> Outcome:
        os._exit(3)


@pytest.fixture
def test_checks() -> Iterator[None]:
    for name, check in (("t.hangs", Hangs()), ("t.raises", Raises()), ("t.dies", Dies())):
        registry.add(name, check, "test")
    yield
    for name in ("t.hangs", "t.raises", "t.dies"):
        registry.remove(name)


@pytest.mark.usefixtures("test_checks")
def test_a_hanging_check_is_killed_at_its_budget(make_ctx: Callable[..., CheckContext]) -> None:
    before = {child.pid for child in psutil.Process().children(recursive=True)}  # e.g. the session's cluster
    started = time.monotonic()
    result = run_one("t.hangs", make_ctx(), budget=0.5)
    assert time.monotonic() - started < 3
    assert result.status is Status.FAIL and result.reason.startswith("timeout")
    after = [child for child in psutil.Process().children(recursive=True) if child.pid not in before]
    assert not after, "the check and its helper are gone"


@pytest.mark.usefixtures("test_checks")
def test_a_raising_or_dying_check_is_an_error_of_that_check_only(make_ctx: Callable[..., CheckContext]) -> None:
    report = run_checks(["t.raises", "storage.free", "t.dies"], make_ctx(), node="n1")
    statuses = {r.name: r.status for r in report.checks}
    assert statuses == {"t.raises": Status.ERROR, "storage.free": Status.PASS, "t.dies": Status.ERROR}
    assert "RuntimeError: sensor returned garbage" in report.checks[0].reason
    assert "exit status 3" in report.checks[2].reason
    assert not report.ok


def test_selection_only_skip_and_prefixes(config: object) -> None:
    quick = load_config().suites["quick"]
    assert select_checks(quick, only=["storage"]) == ["storage.free", "storage.fsync", "storage.read", "storage.write"]
    assert "gpu.ecc" not in select_checks(quick, skip=["gpu"])
    with pytest.raises(KeyError, match=r"unknown health check 'gpu\.nope'"):
        select_checks(quick, only=["gpu.nope"])


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("storage:\n  min_write_mb_s: fast\n", "storage.min_write_mb_s"),
        ("storage:\n  min_write_mbs: 5\n", "storage.min_write_mbs"),
        ("gpu:\n  fail_throttle_reasons: [hw_slowdwn]\n", "gpu.fail_throttle_reasons"),
        ("compute:\n  models:\n    X: {match: '(', tflops: 1}\n", "compute.models.X.match"),
        ("suites:\n  quick: [gpu.ecc, gpu.eccc]\n", "suites.quick[1]"),
        ("budget_s:\n  default: -1\n", "budget_s.default"),
        ("[1, 2]\n", "mapping at the top"),
    ],
)
def test_a_malformed_config_is_refused_naming_the_key(tmp_path: Path, text: str, key: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(HealthConfigError, match=key.replace("[", r"\[").replace("]", r"\]")) as info:
        load_config(path, known_checks=registry.names())
    assert str(path) in str(info.value)


def test_a_user_config_merges_over_the_defaults(tmp_path: Path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text("storage:\n  min_write_mb_s: 500\ncompute:\n  models:\n    MI300X: {match: MI300X, tflops: 1307}\n")
    cfg = load_config(path, known_checks=registry.names())
    assert cfg.storage.min_write_mb_s == 500 and cfg.storage.min_read_mb_s == 100
    assert cfg.compute.expected_tflops("AMD Instinct MI300X") == ("MI300X", 1307)
    assert cfg.compute.expected_tflops("NVIDIA H100 80GB HBM3") == ("H100-SXM", 989)


def test_cli_check_json_and_exit_codes(tmp_path: Path) -> None:
    runner = CliRunner()
    ok = runner.invoke(build_app(), ["check", "--json", "--only", "storage", "--checkpoint-dir", str(tmp_path)])
    assert ok.exit_code == 0, ok.output
    document = json.loads(ok.stdout)
    assert set(document) == {"node", "checks"}
    assert set(document["checks"][0]) == {"name", "status", "value", "unit", "threshold", "reason", "seconds"}
    strict = tmp_path / "strict.yaml"
    strict.write_text("storage:\n  min_free_gb: 1.0e+9\n")
    failed = runner.invoke(
        build_app(), ["check", "--only", "storage.free", "--config", str(strict), "--checkpoint-dir", str(tmp_path)]
    )
    assert failed.exit_code == 1
    assert runner.invoke(build_app(), ["check", "--only", "gpu.nope"]).exit_code == 2
    bad = tmp_path / "bad.yaml"
    bad.write_text("storage: {min_free_gb: lots}\n")
    usage = runner.invoke(build_app(), ["check", "--config", str(bad)])
    assert usage.exit_code == 2 and "storage.min_free_gb" in usage.output


def test_preflight_cli_gates(tmp_path: Path) -> None:
    runner = CliRunner()
    app = build_app()
    passed = runner.invoke(app, ["preflight", "--json", "--only", "storage", "--checkpoint-dir", str(tmp_path)])
    assert passed.exit_code == 0 and json.loads(passed.stdout)["passed"] is True
    failed = runner.invoke(app, ["preflight", "--only", "storage", "--checkpoint-dir", str(tmp_path / "missing")])
    assert failed.exit_code == 1 and "preflight FAILED" in failed.output


@pytest.mark.parametrize(
    ("times", "slow"),
    [
        pytest.param({(0, 1): 1.0, (2, 3): 1.0}, [], id="all-fast"),
        pytest.param({(0, 1): 1.0, (2, 3): 3.0, (2, 0): 3.0, (3, 1): 1.0}, [2], id="node-2-slow"),
        pytest.param({(0, 1): 3.0, (2, 3): 3.0}, [], id="all-slow-nobody-blamed-by-one-pairing"),
        pytest.param({(0, 1): 1.0, (2, 3): 1.0, (4, 0): 3.0}, [4], id="odd-node-out-slow-partner-cleared"),
    ],
)
def test_find_slow_nodes(times: dict[tuple[int, int], float], slow: list[int]) -> None:
    assert find_slow_nodes(times, 1.0, 2.0) == slow


def test_pairing_plans() -> None:
    assert plan_first_round(5) == [(0, 1), (2, 3)]
    assert plan_second_round(5, {(0, 1): 1.0, (2, 3): 1.1}, 2.0) == [(4, 0)], "the odd node out meets a fast node"
    assert plan_second_round(4, {(0, 1): 1.0, (2, 3): 5.0}, 2.0) == [(2, 0), (3, 1)]


def test_pairwise_finds_the_slow_node_with_real_gloo_groups() -> None:
    pytest.importorskip("torch")
    # 12x slow against a 3x threshold: a loaded 2-core machine can double a healthy pair's time by itself, and
    # the all-reduce half of a pairing is not slowed at all (6x once measured a slow pairing at 2.96x the baseline)
    spec = PairwiseSpec(timeout_s=60, factor=3.0)
    result = simulate_pairwise(4, spec, slowdown={"node-2": 12.0})
    assert result.slow_nodes == ("node-2",), result
    healthy = simulate_pairwise(4, spec)
    assert healthy.slow_nodes == (), healthy
