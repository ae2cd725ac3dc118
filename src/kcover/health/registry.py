"""The registry of health checks: a single-method protocol and a table by name.

A check is any object with ``run(ctx) -> Outcome``.  Modules under
:mod:`kcover.health.checks` register theirs at import with :func:`register`
(the :mod:`kcover.health` package imports them, so the table is full before
anyone looks; this module imports no check, so there is no import circle);
the runner, the CLI (``--only``/``--skip``, ``--list``) and the configuration
loader (which refuses unknown names in ``suites``) look them up here.  A
plug-in adds a check by registering it before the run.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from kcover.health.model import Outcome

if TYPE_CHECKING:
    from kcover.health.config import HealthConfig
    from kcover.health.nvml import NvmlApi


@dataclass(frozen=True)
class CheckContext:
    """What a check may use: the configuration and the seams tests replace.

    ``nvml`` opens an NVML session (the real ``pynvml`` by default, recorded
    readings in tests); ``env`` is the environment the check reads
    (``KCOVER_CHECKPOINT_DIR``, ``KCOVER_EXPECTED_GPUS``, ``CUDA_VISIBLE_DEVICES``).
    """

    config: HealthConfig
    nvml: Callable[[], NvmlApi] | None = None
    env: dict[str, str] | None = None

    def getenv(self, key: str) -> str | None:
        return (self.env if self.env is not None else os.environ).get(key)

    def storage_path(self) -> Path:
        configured = self.config.storage.path or self.getenv("KCOVER_CHECKPOINT_DIR")
        return Path(configured) if configured else Path.cwd()


class Check(Protocol):
    """One health check: measure, compare with the configured threshold, say why."""

    def run(self, ctx: CheckContext) -> Outcome: ...


@dataclass(frozen=True)
class CheckEntry:
    name: str
    check: Check
    summary: str


_REGISTRY: dict[str, CheckEntry] = {}


def register(name: str, summary: str) -> Callable[[type], type]:
    """Class decorator: register an instance of the class under ``name``."""

    def decorate(cls: type) -> type:
        add(name, cls(), summary)
        return cls

    return decorate


def add(name: str, check: Check, summary: str) -> None:
    """Register ``check`` under ``name``; a name is registered once."""
    if name in _REGISTRY:
        raise ValueError(f"health check {name!r} is already registered")
    _REGISTRY[name] = CheckEntry(name, check, summary)


def remove(name: str) -> None:
    """Unregister ``name`` (tests and plug-ins replacing a check)."""
    _REGISTRY.pop(name, None)


def get(name: str) -> CheckEntry:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown health check {name!r}") from None


def names() -> frozenset[str]:
    return frozenset(_REGISTRY)


def entries() -> list[CheckEntry]:
    return sorted(_REGISTRY.values(), key=lambda entry: entry.name)

