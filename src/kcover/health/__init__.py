"""Node health checks: find bad nodes before a job lands on them, release them when healthy.

The parts: :mod:`~kcover.health.model` (statuses, results, reports),
:mod:`~kcover.health.config` (suites, budgets, thresholds and expected values
as validated YAML), :mod:`~kcover.health.registry` (checks by name),
:mod:`~kcover.health.runner` (each check in its own process, killed at its
budget), :mod:`~kcover.health.checks` (GPU/NVML, DCGM, compute, collective,
storage, network), :mod:`~kcover.health.pairwise` (slow-node detection across
a job's nodes), :mod:`~kcover.health.preflight` (the gate before a job starts)
and :mod:`~kcover.health.quarantine` (cordon, taint, NodeCondition, release).
Used by ``kcover check``, ``kcover preflight``, the launcher and the node agent.
"""

from kcover.health import checks as _builtin  # noqa: F401 - importing registers the built-in checks
from kcover.health.config import HealthConfig, HealthConfigError, load_config
from kcover.health.model import CheckResult, HealthReport, Outcome, Status
from kcover.health.registry import Check, CheckContext, register
from kcover.health.runner import run_checks, select_checks

__all__ = [
    "Check",
    "CheckContext",
    "CheckResult",
    "HealthConfig",
    "HealthConfigError",
    "HealthReport",
    "Outcome",
    "Status",
    "load_config",
    "register",
    "run_checks",
    "select_checks",
]
