"""Fixtures for the health-check tests: no leaked child processes, a config, a context, recorded NVML."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from kcover.health import registry
from kcover.health.config import HealthConfig, load_config
from kcover.health.nvml import ReplayNvml
from kcover.health.registry import CheckContext

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(autouse=True)
def no_leftover_children() -> Iterator[None]:
    """Fail a test that leaves any child process of the test runner running (checks, workers, helpers)."""
    me = psutil.Process()
    before = {child.pid for child in me.children(recursive=True)}
    yield
    leaked = []
    for child in me.children(recursive=True):
        try:
            if child.pid not in before and child.status() != psutil.STATUS_ZOMBIE:
                leaked.append(child)
        except psutil.NoSuchProcess:
            continue
    # the test cluster's components are session-scoped children, started before the first test that needs them
    leaked = [p for p in leaked if "kcover-test-cluster" not in " ".join(_cmdline(p))]
    for child in leaked:
        child.kill()
    assert not leaked, f"test left processes behind: {[' '.join(_cmdline(p)) for p in leaked]}"


def _cmdline(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except psutil.Error:
        return []


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
