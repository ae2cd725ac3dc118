# ruff: noqa: N802 - the seam keeps pynvml's function names, so the real module and replays match
"""NVML through a narrow seam: the calls kcover makes, real, recorded or replayed.

:class:`NvmlApi` lists the few ``nvidia-ml-py`` (``pynvml``) functions the GPU
checks use, under their real names.  :class:`PynvmlApi` forwards them to
``pynvml`` and turns its "not supported" errors into :class:`NvmlNotSupportedError`;
:class:`ReplayNvml` answers them from a recorded JSON file; :class:`RecordingNvml`
wraps either and writes down every answer, which is how a fixture is made on a
GPU machine (``python -m kcover.health.nvml > node.json``).  :func:`read_gpus`
turns the answers into :class:`GpuReading` values; the checks in
:mod:`kcover.health.checks.gpu` judge those.  So the code that reads a real GPU
and the code the tests run are the same.

A recording is ``{"driver": ..., "devices": [{function: answer}]}`` where an
answer is a value, ``{"args": {"<a>,<b>": value}}`` for calls with arguments
after the handle, or ``{"error": "NotSupported"}``.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

NVLINK_MAX_LINKS = 18  # links probed per GPU (H100: 18); a missing link answers "not supported"
MEMORY_ERROR_UNCORRECTED = 1  # NVML_MEMORY_ERROR_TYPE_UNCORRECTED
VOLATILE_ECC, AGGREGATE_ECC = 0, 1  # NVML_VOLATILE_ECC, NVML_AGGREGATE_ECC
TEMPERATURE_GPU = 0  # NVML_TEMPERATURE_GPU
RETIRED_SBE, RETIRED_DBE = 0, 1  # NVML_PAGE_RETIREMENT_CAUSE_{MULTIPLE_SINGLE_BIT,DOUBLE_BIT}_ECC_ERROR

THROTTLE_BITS = {  # nvmlClocksThrottleReason* (also called clock event reasons)
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}


class NvmlUnavailableError(RuntimeError):
    """NVML cannot be used here: no driver, no library, no GPU."""


class NvmlNotSupportedError(RuntimeError):
    """This GPU does not support the query (e.g. row remapping before Ampere)."""


class NvmlApi(Protocol):
    """The NVML functions kcover calls, named as in ``pynvml``."""

    def nvmlSystemGetDriverVersion(self) -> str: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> object: ...
    def nvmlDeviceGetName(self, handle: object) -> str: ...
    def nvmlDeviceGetUUID(self, handle: object) -> str: ...
    def nvmlDeviceGetTemperature(self, handle: object, sensor: int) -> int: ...
    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: object) -> int: ...
    def nvmlDeviceGetTotalEccErrors(self, handle: object, error_type: int, counter_type: int) -> int: ...
    def nvmlDeviceGetRetiredPages(self, handle: object, cause: int) -> list[int]: ...
    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: object) -> int: ...
    def nvmlDeviceGetRemappedRows(self, handle: object) -> tuple[int, int, int, int]: ...
    def nvmlDeviceGetNvLinkState(self, handle: object, link: int) -> int: ...
    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: object) -> int: ...
    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: object) -> int: ...
    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: object) -> int: ...
    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: object) -> int: ...


_CALLS = [name for name in NvmlApi.__dict__ if name.startswith("nvml")]


class PynvmlApi:
    """The real NVML: forwards to ``pynvml`` (``nvidia-ml-py``, the ``gpu`` extra)."""

    def __init__(self) -> None:
        try:
            import pynvml
        except ImportError as exc:
            raise NvmlUnavailableError("nvidia-ml-py is not installed (pip install 'kcover[gpu]')") from exc
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise NvmlUnavailableError(f"NVML did not initialise: {exc}") from exc
        self._pynvml: Any = pynvml

    def close(self) -> None:
        self._pynvml.nvmlShutdown()

    def __getattr__(self, name: str) -> Any:
        if name not in _CALLS:
            raise AttributeError(name)
        function = getattr(self._pynvml, name)
        not_supported = (self._pynvml.NVMLError_NotSupported, self._pynvml.NVMLError_InvalidArgument)

        def call(*args: Any) -> Any:
            try:
                value = function(*args)
            except not_supported as exc:
                raise NvmlNotSupportedError(str(exc)) from exc
            return value.decode() if isinstance(value, bytes) else value

        return call


def _key(args: tuple[Any, ...]) -> str:
    return ",".join(str(arg) for arg in args)


class ReplayNvml:
    """Answers the :class:`NvmlApi` calls from a recording; handles are device indexes."""

    def __init__(self, recording: dict[str, Any]) -> None:
        self._recording = recording
        self._devices: list[dict[str, Any]] = recording.get("devices", [])

    @classmethod
    def load(cls, path: Path | str) -> ReplayNvml:
        return cls(json.loads(Path(path).read_text(encoding="utf-8")))

    def close(self) -> None:
        return None

    def nvmlSystemGetDriverVersion(self) -> str:
        return str(self._recording.get("driver", ""))

    def nvmlDeviceGetCount(self) -> int:
        return len(self._devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> object:
        if not 0 <= index < len(self._devices):
            raise NvmlNotSupportedError(f"no device {index}")
        return index

    def __getattr__(self, name: str) -> Any:
        if name not in _CALLS:
            raise AttributeError(name)

        def call(handle: object, *args: Any) -> Any:
            assert isinstance(handle, int)
            answer = self._devices[handle].get(name, {"error": "NotSupported"})
            if isinstance(answer, dict) and "args" in answer:
                answer = answer["args"].get(_key(args), {"error": "NotSupported"})
            if isinstance(answer, dict) and "error" in answer:
                raise NvmlNotSupportedError(f"{name}: {answer['error']}")
            return tuple(answer) if name == "nvmlDeviceGetRemappedRows" else answer

        return call


@dataclass
class RecordingNvml:
    """Wraps an :class:`NvmlApi` and writes down each answer, in the format :class:`ReplayNvml` reads."""

    inner: Any
    recording: dict[str, Any] = field(default_factory=lambda: {"driver": "", "devices": []})
    _handles: dict[int, int] = field(default_factory=dict)

    def nvmlSystemGetDriverVersion(self) -> str:
        version = str(self.inner.nvmlSystemGetDriverVersion())
        self.recording["driver"] = version
        return version

    def nvmlDeviceGetCount(self) -> int:
        count = int(self.inner.nvmlDeviceGetCount())
        self.recording["devices"] = [{} for _ in range(count)]
        return count

    def nvmlDeviceGetHandleByIndex(self, index: int) -> object:
        handle = self.inner.nvmlDeviceGetHandleByIndex(index)
        self._handles[id(handle)] = index
        return handle

    def __getattr__(self, name: str) -> Any:
        if name not in _CALLS:
            raise AttributeError(name)

        def call(handle: object, *args: Any) -> Any:
            device = self.recording["devices"][self._handles[id(handle)]]
            try:
                value = getattr(self.inner, name)(handle, *args)
                stored: Any = list(value) if isinstance(value, tuple) else value
            except NvmlNotSupportedError:
                value, stored = None, {"error": "NotSupported"}
            if args:
                device.setdefault(name, {"args": {}})["args"][_key(args)] = stored
            else:
                device[name] = stored
            if value is None:
                raise NvmlNotSupportedError(name)
            return value

        return call


@dataclass(frozen=True)
class GpuReading:
    """What NVML says about one GPU; ``None`` where the GPU does not support the query."""

    index: int
    name: str
    uuid: str
    temperature_c: int | None
    throttle_reasons: tuple[str, ...]
    ecc_volatile_uncorrected: int | None
    ecc_aggregate_uncorrected: int | None
    retired_pages: int | None
    retired_pending: bool | None
    remapped_uncorrectable: int | None
    remap_pending: bool | None
    remap_failed: bool | None
    nvlinks_up: int
    nvlinks_down: tuple[int, ...]
    pcie_width: tuple[int, int] | None  # current, max
    pcie_generation: tuple[int, int] | None


def _maybe(call: Any, *args: Any) -> Any:
    try:
        return call(*args)
    except NvmlNotSupportedError:
        return None


def read_gpus(api: NvmlApi) -> list[GpuReading]:
    """Read every GPU NVML sees; one :class:`GpuReading` each, in index order."""
    readings = []
    for index in range(api.nvmlDeviceGetCount()):
        handle = api.nvmlDeviceGetHandleByIndex(index)
        mask = _maybe(api.nvmlDeviceGetCurrentClocksThrottleReasons, handle) or 0
        sbe = _maybe(api.nvmlDeviceGetRetiredPages, handle, RETIRED_SBE)
        dbe = _maybe(api.nvmlDeviceGetRetiredPages, handle, RETIRED_DBE)
        pending = _maybe(api.nvmlDeviceGetRetiredPagesPendingStatus, handle)
        remap = _maybe(api.nvmlDeviceGetRemappedRows, handle)
        links = [_maybe(api.nvmlDeviceGetNvLinkState, handle, link) for link in range(NVLINK_MAX_LINKS)]
        widths = (_maybe(api.nvmlDeviceGetCurrPcieLinkWidth, handle), _maybe(api.nvmlDeviceGetMaxPcieLinkWidth, handle))
        gens = (
            _maybe(api.nvmlDeviceGetCurrPcieLinkGeneration, handle),
            _maybe(api.nvmlDeviceGetMaxPcieLinkGeneration, handle),
        )
        readings.append(
            GpuReading(
                index=index,
                name=str(api.nvmlDeviceGetName(handle)),
                uuid=str(_maybe(api.nvmlDeviceGetUUID, handle) or ""),
                temperature_c=_maybe(api.nvmlDeviceGetTemperature, handle, TEMPERATURE_GPU),
                throttle_reasons=tuple(name for bit, name in THROTTLE_BITS.items() if mask & bit),
                ecc_volatile_uncorrected=_maybe(
                    api.nvmlDeviceGetTotalEccErrors, handle, MEMORY_ERROR_UNCORRECTED, VOLATILE_ECC
                ),
                ecc_aggregate_uncorrected=_maybe(
                    api.nvmlDeviceGetTotalEccErrors, handle, MEMORY_ERROR_UNCORRECTED, AGGREGATE_ECC
                ),
                retired_pages=None if sbe is None and dbe is None else len(sbe or []) + len(dbe or []),
                retired_pending=None if pending is None else bool(pending),
                remapped_uncorrectable=None if remap is None else int(remap[1]),
                remap_pending=None if remap is None else bool(remap[2]),
                remap_failed=None if remap is None else bool(remap[3]),
                nvlinks_up=sum(1 for state in links if state == 1),
                nvlinks_down=tuple(link for link, state in enumerate(links) if state == 0),
                pcie_width=None if None in widths else (int(widths[0]), int(widths[1])),
                pcie_generation=None if None in gens else (int(gens[0]), int(gens[1])),
            )
        )
    return readings


def main() -> None:
    """Record this machine's NVML answers as JSON on stdout (a fixture for the tests)."""
    api = PynvmlApi()
    recorder = RecordingNvml(api)
    recorder.nvmlSystemGetDriverVersion()
    read_gpus(recorder)
    api.close()
    json.dump(recorder.recording, sys.stdout, indent=1)


if __name__ == "__main__":
    main()
