"""GPU checks over NVML readings constructed from the NVML documentation (see fixtures/*.json _note)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from kcover.health.checks import gpu
from kcover.health.model import Status
from kcover.health.nvml import RecordingNvml, ReplayNvml, read_gpus
from kcover.health.registry import CheckContext

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.mark.parametrize(
    ("fixture", "check", "status", "needle"),
    [
        ("nvml_h100x8_healthy.json", "gpu.ecc", Status.PASS, "no uncorrectable"),
        ("nvml_h100x8_healthy.json", "gpu.memory_rows", Status.PASS, "no pending"),
        ("nvml_h100x8_healthy.json", "gpu.thermal", Status.PASS, "hottest GPU 7 at 37"),
        ("nvml_h100x8_healthy.json", "gpu.nvlink", Status.PASS, "18 NVLinks"),
        ("nvml_h100x8_healthy.json", "gpu.pcie", Status.PASS, "full width"),
        ("nvml_a100x8_faulty.json", "gpu.ecc", Status.FAIL, "GPU 3: 2 uncorrectable"),
        ("nvml_a100x8_faulty.json", "gpu.memory_rows", Status.FAIL, "GPU 3: memory repair pending"),
        ("nvml_a100x8_faulty.json", "gpu.thermal", Status.FAIL, "GPU 6: clocks slowed by hw_slowdown"),
        ("nvml_a100x8_faulty.json", "gpu.nvlink", Status.FAIL, "GPU 5: NVLink 4 down"),
        ("nvml_a100x8_faulty.json", "gpu.pcie", Status.WARN, "GPU 7: PCIe link x8 of x16"),
        ("nvml_v100x4_retired.json", "gpu.memory_rows", Status.PASS, "no pending"),
        ("nvml_v100x4_retired.json", "gpu.ecc", Status.WARN, "lifetime"),
    ],
)
def test_recorded_readings(
    make_ctx: Callable[..., CheckContext], fixture: str, check: str, status: Status, needle: str
) -> None:
    from kcover.health import registry

    outcome = registry.get(check).check.run(make_ctx(nvml=fixture))
    assert outcome.status is status, outcome
    assert needle in outcome.reason


def test_inventory_against_expected_count(make_ctx: Callable[..., CheckContext]) -> None:
    check = gpu.Inventory()
    assert check.run(make_ctx(nvml="nvml_h100x8_healthy.json", env={"KCOVER_EXPECTED_GPUS": "8"})).status is Status.PASS
    short = check.run(make_ctx(nvml="nvml_v100x4_retired.json", env={"KCOVER_EXPECTED_GPUS": "8"}))
    assert (short.status, short.value, short.threshold) == (Status.FAIL, 4, 8)


def test_without_nvml_gpu_checks_skip_unless_gpus_are_expected(make_ctx: Callable[..., CheckContext]) -> None:
    ctx = make_ctx()  # the real pynvml: this machine has no NVIDIA driver
    for check in (gpu.Ecc(), gpu.Thermal(), gpu.NvLink()):
        outcome = check.run(ctx)
        assert outcome.status is Status.SKIPPED
        assert "no NVIDIA GPU" in outcome.reason
    expected = gpu.Inventory().run(make_ctx(env={"KCOVER_EXPECTED_GPUS": "8"}))
    assert expected.status is Status.FAIL


def test_recording_round_trip_reproduces_the_fixture() -> None:
    original = json.loads((FIXTURES / "nvml_a100x8_faulty.json").read_text())
    recorder = RecordingNvml(ReplayNvml(original))
    recorder.nvmlSystemGetDriverVersion()
    readings = read_gpus(recorder)
    assert readings == read_gpus(ReplayNvml(recorder.recording))
    assert readings[3].remap_pending and readings[5].nvlinks_down == (4,) and readings[7].pcie_width == (8, 16)


def test_xid_history_from_the_kernel_log(make_ctx: Callable[..., CheckContext], tmp_path: Path) -> None:
    log = tmp_path / "kmsg.txt"
    log.write_text(
        "[ 1.0] NVRM: loading NVIDIA UNIX x86_64 Kernel Module\n"
        "[ 9.1] NVRM: Xid (PCI:0000:3b:00): 79, pid=4005, GPU has fallen off the bus.\n"
    )
    outcome = gpu.XidHistory().run(make_ctx(gpu={"kernel_log": str(log)}))
    assert outcome.status is Status.FAIL and "79" in outcome.reason
    log.write_text("[ 1.0] NVRM: loading NVIDIA UNIX x86_64 Kernel Module\n")
    assert gpu.XidHistory().run(make_ctx(gpu={"kernel_log": str(log)})).status is Status.PASS
    missing = gpu.XidHistory().run(make_ctx(gpu={"kernel_log": str(tmp_path / "none")}))
    assert missing.status is Status.SKIPPED
