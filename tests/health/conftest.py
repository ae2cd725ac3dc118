"""Fixtures for the health-check tests: no leaked child processes, a config, a context, recorded NVML."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kcover.health import registry
from kcover.health.config import HealthConfig, load_config
from kcover.health.nvml import ReplayNvml
from kcover.health.registry import CheckContext

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
def config() -> HealthConfig:
    return load_config(known_checks=registry.names())


@pytest.fixture
def make_ctx(config: HealthConfig, tmp_path: Path) -> Callable[..., CheckContext]:
    """A context whose checkpoint path is tmp_path, with optional recorded NVML and config overrides."""

    def make(
        nvml: str | dict[str, Any] | None = None, env: dict[str, str] | None = None, **sections: Any
    ) -> CheckContext:
        cfg = config
        if sections:
            data = config.model_dump()
            for section, values in sections.items():
                data[section] = {**data[section], **values} if isinstance(values, dict) else values
            cfg = HealthConfig.model_validate(data)
        opener = None
        if nvml is not None:
            recording = nvml if isinstance(nvml, dict) else json.loads((FIXTURES / nvml).read_text())
            opener = lambda: ReplayNvml(recording)  # noqa: E731
        return CheckContext(cfg, nvml=opener, env={"KCOVER_CHECKPOINT_DIR": str(tmp_path), **(env or {})})

    return make
