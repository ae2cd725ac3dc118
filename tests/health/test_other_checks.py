"""DCGM parsing, compute judgement, storage, InfiniBand sysfs and the gloo all-reduce."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from kcover.health.checks import collective, compute, dcgm, network, storage
from kcover.health.model import Status
from kcover.health.registry import CheckContext

FIXTURES = Path(__file__).parent / "fixtures"


def test_dcgm_table_failure_names_the_test_and_the_warning() -> None:
    tests = dcgm.parse_diag((FIXTURES / "dcgmi_diag_r1_fail.txt").read_text())
    assert [t.name for t in tests][:2] == ["Denylist", "NVML Library"]
    assert {t.name: t.result for t in tests}["Inforom"] == "Skip"
    outcome = dcgm.judge_diag(tests, 1)
    assert outcome.status is Status.FAIL
    assert "Page Retirement/Row Remap" in outcome.reason and "GPU 3" in outcome.reason


def test_dcgm_table_pass() -> None:
    outcome = dcgm.judge_diag(dcgm.parse_diag((FIXTURES / "dcgmi_diag_r1_pass.txt").read_text()), 1)
    assert outcome.status is Status.PASS and "8 tests passed" in outcome.reason


def test_dcgm_absent_is_skipped(make_ctx: Callable[..., CheckContext]) -> None:
    outcome = dcgm.DcgmDiag().run(make_ctx(dcgm={"command": "dcgmi-not-installed"}))
    assert outcome.status is Status.SKIPPED


@pytest.mark.parametrize(
    ("tflops", "checksums", "status"),
    [
        ([700, 690], [1.0, 1.0], Status.PASS),
        ([700, 300], [1.0, 1.0], Status.FAIL),
        ([700, 700], [1.0, 1.5], Status.FAIL),
    ],
    ids=["healthy", "slow-gpu", "wrong-result"],
)
def test_compute_judgement(tflops: list[float], checksums: list[float], status: Status) -> None:
    burns = [compute.Burn(f"cuda:{i}", t, c) for i, (t, c) in enumerate(zip(tflops, checksums, strict=True))]
    outcome = compute.judge_burns(burns, ["NVIDIA H100 80GB HBM3"] * 2, [("H100-SXM", 989.0)] * 2, 0.5, 0.0)
    assert outcome.status is status, outcome


def test_matmul_burn_on_cpu_measures_throughput() -> None:
    torch = pytest.importorskip("torch")
    burn = compute.matmul_burn(torch, "cpu", 128, 0.05)
    assert burn.tflops > 0 and burn.checksum == compute.matmul_burn(torch, "cpu", 128, 0.01).checksum


def test_storage_checks_on_a_real_folder(make_ctx: Callable[..., CheckContext], tmp_path: Path) -> None:
    ctx = make_ctx(storage={"size_mb": 8, "min_write_mb_s": 1, "min_read_mb_s": 1})
    for check in (storage.WriteThroughput(), storage.ReadThroughput(), storage.FsyncLatency(), storage.FreeSpace()):
        outcome = check.run(ctx)
        assert outcome.status is Status.PASS, outcome
        assert isinstance(outcome.value, float) and outcome.value > 0
    assert list(tmp_path.iterdir()) == [], "scratch files are removed"
    impossible = storage.WriteThroughput().run(make_ctx(storage={"size_mb": 4, "min_write_mb_s": 1e9}))
    assert impossible.status is Status.FAIL
    missing = storage.FsyncLatency().run(make_ctx(storage={"path": str(tmp_path / "nope")}))
    assert missing.status is Status.FAIL and "not a folder" in missing.reason


def test_storage_checks_of_many_nodes_in_one_shared_folder_at_once_all_pass(
        make_ctx: Callable[..., CheckContext], tmp_path: Path) -> None:
    """Every node's agent checks the same shared checkpoint folder, often as pid 1 of its container: the scratch
    files were named by the pid, so the agents wrote, read and removed one file (here: threads of one pid)."""
    from concurrent.futures import ThreadPoolExecutor

    # floors that twelve checks sharing two cores always meet: only a check that broke another's file fails
    ctx = make_ctx(storage={"size_mb": 8, "min_write_mb_s": 0.01, "min_read_mb_s": 0.01, "max_fsync_p99_ms": 60_000})
    checks = [storage.ReadThroughput(), storage.WriteThroughput(), storage.FsyncLatency()] * 4
    with ThreadPoolExecutor(len(checks)) as pool:
        outcomes = list(pool.map(lambda check: check.run(ctx), checks))
    assert [o.status for o in outcomes] == [Status.PASS] * len(checks), outcomes
    assert list(tmp_path.iterdir()) == []


def test_free_space_judgement() -> None:
    assert storage.judge_free(5, 0.5, 10, 0.05, "/x").status is Status.FAIL
    assert storage.judge_free(500, 0.01, 10, 0.05, "/x").status is Status.FAIL
    assert storage.judge_free(500, 0.5, 10, 0.05, "/x").status is Status.PASS


def test_infiniband_ports_flaps_and_degraded_rate(make_ctx: Callable[..., CheckContext], tmp_path: Path) -> None:
    root = tmp_path / "sysfs"
    shutil.copytree(FIXTURES / "sysfs_ib", root)
    ctx = make_ctx(network={"sysfs_root": str(root), "state_dir": str(tmp_path / "state")})
    assert network.IbPorts().run(ctx).status is Status.PASS
    assert "baseline" in network.IbFlaps().run(ctx).reason
    assert network.IbFlaps().run(ctx).status is Status.PASS
    (root / "mlx5_1/ports/1/counters/link_downed").write_text("4\n")
    flapped = network.IbFlaps().run(ctx)
    assert (flapped.status, flapped.value) == (Status.FAIL, 2) and "mlx5_1/1" in flapped.reason
    (root / "mlx5_0/ports/1/rate").write_text("200 Gb/sec (4X HDR)\n")
    assert "degraded" in network.IbPorts().run(ctx).reason
    (root / "mlx5_0/ports/1/state").write_text("1: DOWN\n")
    down = network.IbPorts().run(ctx)
    assert down.status is Status.FAIL and "mlx5_0/1" in down.reason
    assert network.IbPorts().run(make_ctx(network={"sysfs_root": str(tmp_path / "none")})).status is Status.SKIPPED


def test_gloo_allreduce_across_processes() -> None:
    pytest.importorskip("torch")
    seconds = collective.measure_allreduce(2, "gloo", 4 << 20, 2, timeout=60)
    assert 0 < seconds < 10
    assert collective.bus_bandwidth(1_000_000_000, 1.0, 8) == pytest.approx(1.75)
