"""Health-check configuration as data: suites, budgets, thresholds, expected values.

The defaults ship as ``kcover/health/defaults.yaml``; a user file given with
``--config`` is merged over them (mappings key by key, everything else
replaced) and the result is validated here with pydantic.  A malformed file is
refused whole with :class:`HealthConfigError`, whose message names the file
and the dotted key (``storage.min_write_mb_s``), so a typo never silently turns
a check off.  Called by the CLI, :func:`kcover.health.preflight.run_preflight`
and (later) the node agent.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator


class HealthConfigError(ValueError):
    """A health configuration cannot be used; the message names the file and the key."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


THROTTLE_REASONS = (
    "gpu_idle",
    "applications_clocks_setting",
    "sw_power_cap",
    "hw_slowdown",
    "sync_boost",
    "sw_thermal_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
    "display_clock_setting",
)


class GpuConfig(_Strict):
    expected_count: int | None = Field(default=None, ge=0)
    max_volatile_uncorrectable_ecc: int = Field(default=0, ge=0)
    max_aggregate_uncorrectable_ecc: int = Field(default=0, ge=0)
    max_retired_pages: int = Field(default=60, ge=0)
    max_remapped_rows_uncorrectable: int = Field(default=0, ge=0)
    warn_temperature_c: float = 85
    fail_temperature_c: float = 95
    fail_throttle_reasons: list[str] = Field(default_factory=list)
    min_pcie_width_fraction: float = Field(default=1.0, ge=0, le=1)
    min_pcie_generation_fraction: float = Field(default=0.0, ge=0, le=1)
    kernel_log: str = "/dev/kmsg"

    @field_validator("fail_throttle_reasons")
    @classmethod
    def _known_reasons(cls, value: list[str]) -> list[str]:
        unknown = [reason for reason in value if reason not in THROTTLE_REASONS]
        if unknown:
            raise ValueError(f"unknown throttle reason {unknown[0]!r}; known: {', '.join(THROTTLE_REASONS)}")
        return value


class DcgmConfig(_Strict):
    level: int = Field(default=1, ge=1, le=4)
    command: str = "dcgmi"


class GpuModel(_Strict):
    match: str = Field(min_length=1)
    tflops: float = Field(gt=0)

    @field_validator("match")
    @classmethod
    def _compiles(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"bad regular expression {value!r}: {exc}") from None
        return value


class ComputeConfig(_Strict):
    seconds: float = Field(default=3.0, gt=0)
    size: int = Field(default=8192, ge=64)
    min_fraction_of_expected: float = Field(default=0.5, gt=0, le=1)
    max_disagreement: float = Field(default=0.0, ge=0)
    models: dict[str, GpuModel] = Field(default_factory=dict)

    def expected_tflops(self, device_name: str) -> tuple[str, float] | None:
        """The table row for a device name (first ``match`` found), or None for an unknown model."""
        for model, row in self.models.items():
            if re.search(row.match, device_name):
                return model, row.tflops
        return None


class CollectiveConfig(_Strict):
    processes: int = Field(default=2, ge=2, le=64)
    size_mb: float = Field(default=32, gt=0)
    iterations: int = Field(default=5, ge=1)
    min_busbw_gb_s_cpu: float = Field(default=0.1, ge=0)
    min_busbw_gb_s_gpu: float = Field(default=100, ge=0)


class StorageConfig(_Strict):
    path: str | None = None
    size_mb: int = Field(default=64, ge=1)
    min_write_mb_s: float = Field(default=50, ge=0)
    min_read_mb_s: float = Field(default=100, ge=0)
    fsync_samples: int = Field(default=20, ge=1)
    max_fsync_p99_ms: float = Field(default=50, gt=0)
    min_free_gb: float = Field(default=10, ge=0)
    min_free_fraction: float = Field(default=0.05, ge=0, le=1)


class NetworkConfig(_Strict):
    sysfs_root: str = "/sys/class/infiniband"
    min_rate_gbps: float | None = Field(default=None, ge=0)
    max_link_downed_delta: int = Field(default=0, ge=0)
    state_dir: str | None = None


class HealthConfig(_Strict):
    """The whole validated configuration (see ``defaults.yaml`` for the meaning of each key)."""

    suites: dict[str, list[str]]
    budget_s: dict[str, float] = Field(default_factory=lambda: {"default": 10.0})
    gpu: GpuConfig = GpuConfig()
    dcgm: DcgmConfig = DcgmConfig()
    compute: ComputeConfig = ComputeConfig()
    collective: CollectiveConfig = CollectiveConfig()
    storage: StorageConfig = StorageConfig()
    network: NetworkConfig = NetworkConfig()

    @model_validator(mode="after")
    def _consistent(self) -> HealthConfig:
        if "default" not in self.budget_s:
            raise ValueError("budget_s.default is required")
        for name, seconds in self.budget_s.items():
            if seconds <= 0:
                raise ValueError(f"budget_s.{name} must be > 0, got {seconds}")
        if self.gpu.warn_temperature_c > self.gpu.fail_temperature_c:
            raise ValueError("gpu.warn_temperature_c must not exceed gpu.fail_temperature_c")
        return self

    def budget(self, check: str) -> float:
        return self.budget_s.get(check, self.budget_s["default"])


def _merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _read(text: str, source: str) -> dict[str, Any]:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise HealthConfigError(f"{source}: not valid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise HealthConfigError(f"{source}: expected a mapping at the top, got {type(data).__name__}")
    return data


def _describe(error: ValidationError, source: str) -> str:
    problems = []
    for item in error.errors():
        key = ".".join(str(part) for part in item["loc"]) or "(top)"
        got = item.get("input")
        shown = f" (got {got!r})" if item["type"] != "missing" and not isinstance(got, dict | list) else ""
        problems.append(f"{key}: {item['msg']}{shown}")
    return f"{source}: " + "; ".join(problems)


def default_text() -> str:
    return resources.files("kcover.health").joinpath("defaults.yaml").read_text(encoding="utf-8")


def load_config(path: Path | str | None = None, *, known_checks: frozenset[str] | None = None) -> HealthConfig:
    """The defaults, with the file at ``path`` merged over them, validated.

    ``known_checks`` (the registry's names) also validates the check names used
    in ``suites`` and ``budget_s``.
    """
    data = _read(default_text(), "defaults.yaml")
    source = "defaults.yaml"
    if path is not None:
        source = str(path)
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise HealthConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
        data = _merge(data, _read(text, source))
    try:
        config = HealthConfig.model_validate(data)
    except ValidationError as exc:
        raise HealthConfigError(_describe(exc, source)) from None
    if known_checks is not None:
        _check_names(config, known_checks, source)
    return config


def _check_names(config: HealthConfig, known: frozenset[str], source: str) -> None:
    for suite, names in config.suites.items():
        for index, name in enumerate(names):
            if name not in known:
                raise HealthConfigError(f"{source}: suites.{suite}[{index}]: unknown check {name!r}")
    for name in config.budget_s:
        if name != "default" and name not in known:
            raise HealthConfigError(f"{source}: budget_s.{name}: unknown check {name!r}")
