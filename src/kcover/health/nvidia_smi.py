"""NVML readings from ``nvidia-smi -q -x``: the report nvidia-smi prints, as answers to the NVML calls.

nvidia-smi is itself an NVML client, and its XML report (formats v10–v13)
carries every reading the GPU checks use except NVLink state.
:func:`recording_from_xml` turns a report into a recording that
:class:`~kcover.health.nvml.ReplayNvml` answers from, so the same
``read_gpus`` and the same judges run on it.  Two uses:

- a GPU node whose image has the ``nvidia-smi`` binary (the NVIDIA container
  toolkit mounts it) but not ``nvidia-ml-py`` is still checked:
  :func:`open_nvidia_smi` runs it when ``pynvml`` is unavailable;
- a report saved on a sick node (``nvidia-smi -q -x > node.xml``) can be
  judged anywhere: ``kcover check --nvidia-smi-xml node.xml``.

A reading the report gives as ``N/A`` (or leaves out) answers "not
supported", as NVML would.  Used by :mod:`kcover.health.checks.gpu` and
:mod:`kcover.cli.check_cmd`.
"""

from __future__ import annotations

import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from kcover.health.nvml import (
    AGGREGATE_ECC,
    MEMORY_ERROR_UNCORRECTED,
    RETIRED_DBE,
    RETIRED_SBE,
    TEMPERATURE_GPU,
    THROTTLE_BITS,
    VOLATILE_ECC,
    NvmlUnavailableError,
    ReplayNvml,
)

NOT_SUPPORTED = {"error": "NotSupported"}
RUN_TIMEOUT_SECONDS = 30.0
# the report spells one reason differently from kcover's NVML names
_REASON_BITS = {name: bit for bit, name in THROTTLE_BITS.items()} | {"display_clocks_setting": 0x100}
_REASON_PREFIXES = ("clocks_event_reason_", "clocks_throttle_reason_")


class NvidiaSmiReportError(ValueError):
    """The text is not an ``nvidia-smi -q -x`` report."""


def _number(text: str | None) -> int | None:
    """``"27 C"``, ``"16x"``, ``"4"`` → the integer; ``"N/A"``, empty or missing → None."""
    if text is None:
        return None
    word = text.strip().split(" ")[0].removesuffix("x")
    return int(word) if word.isdigit() else None


def _yes_no(text: str | None) -> bool | None:
    value = (text or "").strip()
    return {"Yes": True, "No": False}.get(value)


def _or_not_supported(value: Any) -> Any:
    return NOT_SUPPORTED if value is None else value


def _throttle_mask(gpu: ET.Element) -> int | None:
    section = gpu.find("clocks_event_reasons")
    if section is None:
        section = gpu.find("clocks_throttle_reasons")
    if section is None:
        return None
    mask = 0
    for reason in section:
        name = reason.tag
        for prefix in _REASON_PREFIXES:
            name = name.removeprefix(prefix)
        if (reason.text or "").strip() == "Active":
            mask |= _REASON_BITS.get(name, 0)
    return mask


def _uncorrected(counters: ET.Element | None) -> int | None:
    """Uncorrectable ECC errors in one timescale: SRAM + DRAM (v11+) or the double-bit total (v10 and older)."""
    if counters is None:
        return None
    double_bit = counters.find("double_bit/total")
    if double_bit is not None:
        return _number(double_bit.text)
    values = [_number(child.text) for child in counters if "uncorrectable" in child.tag]
    known = [value for value in values if value is not None]
    return sum(known) if known else None


def _retired(pages: ET.Element | None, cause: str) -> list[int] | None:
    count = _number(pages.findtext(f"{cause}/retired_count") if pages is not None else None)
    return None if count is None else list(range(count))  # NVML gives the addresses; the checks count them


def _remapped_rows(gpu: ET.Element) -> list[int] | None:
    rows = gpu.find("remapped_rows")
    if rows is None:
        return None
    corrected, uncorrected = _number(rows.findtext("remapped_row_corr")), _number(rows.findtext("remapped_row_unc"))
    pending, failed = _yes_no(rows.findtext("remapped_row_pending")), _yes_no(rows.findtext("remapped_row_failure"))
    if corrected is None or uncorrected is None or pending is None or failed is None:
        return None  # "N/A": this GPU has no row remapper (before Ampere) or MIG hides it
    return [corrected, uncorrected, int(pending), int(failed)]


def _device(gpu: ET.Element) -> dict[str, Any]:
    ecc_on = (gpu.findtext("ecc_mode/current_ecc") or "").strip() == "Enabled"
    volatile = _uncorrected(gpu.find("ecc_errors/volatile")) if ecc_on else None
    aggregate = _uncorrected(gpu.find("ecc_errors/aggregate")) if ecc_on else None
    pages = gpu.find("retired_pages")
    pending = pages.findtext("pending_retirement") if pages is not None else None
    if _yes_no(pending) is None and pages is not None:
        pending = pages.findtext("pending_blacklist")  # the older name of the same flag
    link = gpu.find("pci/pci_gpu_link_info")
    link = link if link is not None else ET.Element("missing")  # every reading of it: None
    pending_flag = _yes_no(pending)
    return {
        "nvmlDeviceGetName": (gpu.findtext("product_name") or "").strip(),
        "nvmlDeviceGetUUID": _or_not_supported((gpu.findtext("uuid") or "").strip() or None),
        "nvmlDeviceGetTemperature": {"args": {
            str(TEMPERATURE_GPU): _or_not_supported(_number(gpu.findtext("temperature/gpu_temp")))}},
        "nvmlDeviceGetCurrentClocksThrottleReasons": _or_not_supported(_throttle_mask(gpu)),
        "nvmlDeviceGetTotalEccErrors": {"args": {
            f"{MEMORY_ERROR_UNCORRECTED},{VOLATILE_ECC}": _or_not_supported(volatile),
            f"{MEMORY_ERROR_UNCORRECTED},{AGGREGATE_ECC}": _or_not_supported(aggregate)}},
        "nvmlDeviceGetRetiredPages": {"args": {
            str(RETIRED_SBE): _or_not_supported(_retired(pages, "multiple_single_bit_retirement")),
            str(RETIRED_DBE): _or_not_supported(_retired(pages, "double_bit_retirement"))}},
        "nvmlDeviceGetRetiredPagesPendingStatus": _or_not_supported(None if pending_flag is None
                                                                    else int(pending_flag)),
        "nvmlDeviceGetRemappedRows": _or_not_supported(_remapped_rows(gpu)),
        "nvmlDeviceGetCurrPcieLinkWidth": _or_not_supported(_number(link.findtext("link_widths/current_link_width"))),
        "nvmlDeviceGetMaxPcieLinkWidth": _or_not_supported(_number(link.findtext("link_widths/max_link_width"))),
        "nvmlDeviceGetCurrPcieLinkGeneration": _or_not_supported(_number(link.findtext("pcie_gen/current_link_gen"))),
        "nvmlDeviceGetMaxPcieLinkGeneration": _or_not_supported(_number(link.findtext("pcie_gen/max_link_gen"))),
        # NVLink state is not in the report (it is `nvidia-smi nvlink -s`): every link answers "not supported"
    }


def recording_from_xml(text: str, where: str = "nvidia-smi output") -> dict[str, Any]:
    """A :class:`ReplayNvml` recording of the report ``text``; raises :class:`NvidiaSmiReportError`."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise NvidiaSmiReportError(f"{where}: not XML ({exc})") from None
    if root.tag != "nvidia_smi_log":
        raise NvidiaSmiReportError(f"{where}: not an `nvidia-smi -q -x` report (root element <{root.tag}>)")
    return {"driver": (root.findtext("driver_version") or "").strip(),
            "devices": [_device(gpu) for gpu in root.findall("gpu")]}


def load_report(path: Path) -> ReplayNvml:
    """NVML answers from a saved report; raises :class:`NvidiaSmiReportError` naming the file."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise NvidiaSmiReportError(f"{path}: cannot read: {exc.strerror or exc}") from None
    return ReplayNvml(recording_from_xml(text, str(path)))


def open_nvidia_smi(why_not_nvml: str) -> ReplayNvml:
    """NVML answers from running ``nvidia-smi -q -x`` here; raises NvmlUnavailableError when that fails too."""
    binary = shutil.which("nvidia-smi")
    if binary is None:
        raise NvmlUnavailableError(f"{why_not_nvml}, and nvidia-smi is not on PATH")
    try:
        done = subprocess.run([binary, "-q", "-x"], check=False, capture_output=True, text=True,
                              timeout=RUN_TIMEOUT_SECONDS)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NvmlUnavailableError(f"{why_not_nvml}, and {binary} -q -x failed: {exc}") from None
    if done.returncode != 0:
        said = (done.stdout + done.stderr).strip().splitlines()
        raise NvmlUnavailableError(f"{why_not_nvml}, and {binary} -q -x exited {done.returncode}: "
                                   f"{said[-1] if said else 'no output'}")
    try:
        return ReplayNvml(recording_from_xml(done.stdout, f"{binary} -q -x"))
    except NvidiaSmiReportError as exc:
        raise NvmlUnavailableError(f"{why_not_nvml}, and {exc}") from None
