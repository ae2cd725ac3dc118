"""The GPU checks over real ``nvidia-smi -q -x`` reports (fixtures/nvidia-smi, recorded on real machines).

Faults are made by editing one value of a real report inside the test; the
fallback to the ``nvidia-smi`` binary runs a stand-in script that prints a real
report (no NVIDIA driver can exist on these machines).
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from kcover.health import registry
from kcover.health.model import Status
from kcover.health.nvidia_smi import NvidiaSmiReportError, load_report, recording_from_xml
from kcover.health.nvml import GpuReading, ReplayNvml, read_gpus
from kcover.health.registry import CheckContext

REPORTS = Path(__file__).parent / "fixtures" / "nvidia-smi"


def kcover(args: list[str]) -> subprocess.CompletedProcess[str]:
    """The real command line, as a user runs it (its error lines, its exit codes)."""
    return subprocess.run([sys.executable, "-m", "kcover", *args], capture_output=True, text=True, timeout=120,
                          check=False)


def reading(name: str, edit: tuple[str, str] | None = None) -> GpuReading:
    text = (REPORTS / name).read_text()
    if edit is not None:
        assert edit[0] in text, edit
        text = text.replace(edit[0], edit[1], 1)
    (gpu,) = read_gpus(ReplayNvml(recording_from_xml(text)))
    return gpu


def test_every_reading_of_a_real_a10g_report() -> None:
    gpu = reading("a10g.xml")
    assert (gpu.name, gpu.uuid) == ("NVIDIA A10G", "GPU-9a9a6c50-2a47-2f51-a902-b82c3b127e94")
    assert gpu.temperature_c == 17
    assert gpu.throttle_reasons == ("gpu_idle",)
    assert (gpu.ecc_volatile_uncorrected, gpu.ecc_aggregate_uncorrected) == (0, 0)
    assert (gpu.retired_pages, gpu.retired_pending) == (None, None)  # N/A: Ampere remaps rows instead
    assert (gpu.remapped_uncorrectable, gpu.remap_pending, gpu.remap_failed) == (0, False, False)
    assert (gpu.pcie_width, gpu.pcie_generation) == ((8, 16), (1, 4))
    assert (gpu.nvlinks_up, gpu.nvlinks_down) == (0, ())  # not in the report


@pytest.mark.parametrize(
    ("report", "expected"),
    [
        ("a100-sxm4-v12.xml", {"name": "NVIDIA A100-SXM4-80GB", "temperature_c": 27, "throttle_reasons": (),
                               "ecc_volatile_uncorrected": 0, "remapped_uncorrectable": None,
                               "pcie_width": (16, 16)}),
        ("tesla-t4.xml", {"name": "Tesla T4", "temperature_c": 40, "retired_pages": 0, "retired_pending": False,
                          "ecc_aggregate_uncorrected": 0, "pcie_generation": (3, 3)}),
        ("quadro-p2000-v12.xml", {"name": "Quadro P2000", "ecc_volatile_uncorrected": None,
                                  "throttle_reasons": ("gpu_idle",), "pcie_width": (8, 16)}),
        ("rtx-4000-sff-ada-v13.xml", {"name": "NVIDIA RTX 4000 SFF Ada Generation", "temperature_c": 38,
                                      "ecc_volatile_uncorrected": None, "remap_pending": False,
                                      "throttle_reasons": ("gpu_idle",), "pcie_generation": (1, 4)}),
    ],
)
def test_report_formats_v11_to_v13(report: str, expected: dict[str, object]) -> None:
    gpu = reading(report)
    assert {key: getattr(gpu, key) for key in expected} == expected


@pytest.mark.parametrize(
    ("report", "check", "status", "needle"),
    [
        ("a100-sxm4-v12.xml", "gpu.ecc", Status.PASS, "no uncorrectable"),
        ("a100-sxm4-v12.xml", "gpu.thermal", Status.PASS, "at 27"),
        ("a100-sxm4-v12.xml", "gpu.pcie", Status.PASS, "full width"),
        ("a100-sxm4-v12.xml", "gpu.nvlink", Status.SKIPPED, "no NVLink"),
        ("a10g.xml", "gpu.memory_rows", Status.PASS, "no pending"),
        ("a10g.xml", "gpu.thermal", Status.PASS, "at 17"),  # gpu_idle lowers clocks: not a slowdown
        ("tesla-t4.xml", "gpu.pcie", Status.WARN, "GPU 0: PCIe link x8 of x16"),  # as recorded, under load
        ("rtx-4000-sff-ada-v13.xml", "gpu.pcie", Status.PASS, "full width"),  # gen 1 of 4 at idle is normal
        ("rtx-4000-sff-ada-v13.xml", "gpu.ecc", Status.SKIPPED, "ECC"),
    ],
)
def test_checks_judge_real_reports(
    make_ctx: Callable[..., CheckContext], report: str, check: str, status: Status, needle: str
) -> None:
    outcome = registry.get(check).check.run(make_ctx(nvml=recording_from_xml((REPORTS / report).read_text())))
    assert outcome.status is status, outcome
    assert needle in outcome.reason


@pytest.mark.parametrize(
    ("report", "edit", "check", "needle"),
    [
        ("a100-sxm4-v12.xml", ("<dram_uncorrectable>0</dram_uncorrectable>",
                               "<dram_uncorrectable>2</dram_uncorrectable>"), "gpu.ecc", "GPU 0: 2 uncorrectable"),
        ("a10g.xml", ("<remapped_row_pending>No", "<remapped_row_pending>Yes"), "gpu.memory_rows",
         "GPU 0: memory repair pending"),
        ("tesla-t4.xml", ("<clocks_throttle_reason_hw_slowdown>Not Active",
                          "<clocks_throttle_reason_hw_slowdown>Active"),
         "gpu.thermal", "GPU 0: clocks slowed by hw_slowdown"),
        ("rtx-4000-sff-ada-v13.xml", ("<clocks_event_reason_hw_thermal_slowdown>Not Active",
                                      "<clocks_event_reason_hw_thermal_slowdown>Active"),
         "gpu.thermal", "hw_thermal_slowdown"),
    ],
)
def test_one_value_made_faulty_in_a_real_report_fails_its_check(
    make_ctx: Callable[..., CheckContext], report: str, edit: tuple[str, str], check: str, needle: str
) -> None:
    text = (REPORTS / report).read_text()
    assert edit[0] in text
    outcome = registry.get(check).check.run(make_ctx(nvml=recording_from_xml(text.replace(edit[0], edit[1], 1))))
    assert outcome.status is Status.FAIL, outcome
    assert needle in outcome.reason


def test_cli_judges_a_saved_report_and_refuses_a_bad_one(tmp_path: Path) -> None:
    done = kcover(["check", "--json", "--only", "gpu", "--skip", "gpu.xid",
                               "--nvidia-smi-xml", str(REPORTS / "tesla-t4.xml")])
    assert done.returncode == 0, done.stderr  # a narrow link warns, it does not fail
    statuses = {c["name"]: c["status"] for c in json.loads(done.stdout)["checks"]}
    assert statuses == {"gpu.inventory": "pass", "gpu.ecc": "pass", "gpu.memory_rows": "pass",
                        "gpu.thermal": "pass", "gpu.nvlink": "skipped", "gpu.pcie": "warn"}
    broken = tmp_path / "cut.xml"
    broken.write_text((REPORTS / "a10g.xml").read_text()[:3000])
    refused = kcover(["check", "--only", "gpu.ecc", "--nvidia-smi-xml", str(broken)])
    assert refused.returncode == 2
    assert f"{broken}: not XML" in refused.stderr and "Traceback" not in refused.stderr
    other = tmp_path / "other.xml"
    other.write_text("<config><gpu/></config>")
    with pytest.raises(NvidiaSmiReportError, match="root element <config>"):
        load_report(other)
    missing = kcover(["check", "--only", "gpu.ecc", "--nvidia-smi-xml", str(tmp_path / "none.xml")])
    assert missing.returncode == 2 and "cannot read" in missing.stderr


def _stand_in(folder: Path, script: str) -> dict[str, str]:
    binary = folder / "nvidia-smi"
    binary.write_text(f"#!/bin/sh\n{script}\n")
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    return {"PATH": f"{folder}{os.pathsep}{os.environ['PATH']}"}


def test_without_nvidia_ml_py_the_checks_run_nvidia_smi(
    make_ctx: Callable[..., CheckContext], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in _stand_in(tmp_path, f'[ "$1 $2" = "-q -x" ] && exec cat "{REPORTS / "a10g.xml"}"').items():
        monkeypatch.setenv(name, value)
    ctx = make_ctx(env={"KCOVER_EXPECTED_GPUS": "1"})  # no nvml seam: pynvml first, then nvidia-smi
    inventory = registry.get("gpu.inventory").check.run(ctx)
    assert (inventory.status, inventory.value) == (Status.PASS, 1)
    assert "driver 515.105.01" in inventory.reason
    assert registry.get("gpu.pcie").check.run(ctx).status is Status.WARN


def test_a_failing_nvidia_smi_says_why_the_gpus_were_not_read(
    make_ctx: Callable[..., CheckContext], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    driverless = "echo \"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\"; exit 9"
    for name, value in _stand_in(tmp_path, driverless).items():
        monkeypatch.setenv(name, value)
    skipped = registry.get("gpu.ecc").check.run(make_ctx())
    assert skipped.status is Status.SKIPPED
    assert "exited 9: NVIDIA-SMI has failed" in skipped.reason
    expected = registry.get("gpu.inventory").check.run(make_ctx(env={"KCOVER_EXPECTED_GPUS": "8"}))
    assert expected.status is Status.FAIL and "couldn't communicate" in expected.reason
