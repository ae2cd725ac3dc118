"""Pre-flight: the gate before a job starts (``kcover preflight``, ``kcover run --preflight``).

Runs a suite (the quick one by default) on this node and, optionally, the
pairwise slow-node test across the job's nodes; the job may start only when
:attr:`PreflightResult.passed`.  The launcher calls :func:`run_preflight`
in-process; as a Kubernetes init container, ``kcover preflight`` exits 1 so the
pod does not start on a bad node.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kcover.health import registry
from kcover.health.config import HealthConfig, load_config
from kcover.health.model import HealthReport
from kcover.health.nvml import NvmlApi
from kcover.health.pairwise import PairwiseResult, PairwiseSpec, pairwise_across_nodes, simulate_pairwise
from kcover.health.registry import CheckContext
from kcover.health.runner import run_checks, select_checks


@dataclass(frozen=True)
class PreflightResult:
    """The gate's answer.  ``across_nodes``: the pairwise test ran over real nodes, one process each, and
    this process answers for its own node only (a slow peer is that peer's init container's to report)."""

    report: HealthReport
    pairwise: PairwiseResult | None = None
    across_nodes: bool = False
    pairwise_factor: float = 2.0

    @property
    def slow_nodes(self) -> tuple[str, ...]:
        return self.pairwise.slow_nodes if self.pairwise else ()

    @property
    def blamed_slow(self) -> tuple[str, ...]:
        """The slow nodes this gate refuses: its own node across nodes, every slow one when simulated."""
        if self.across_nodes:
            return tuple(n for n in self.slow_nodes if n == self.report.node)
        return self.slow_nodes

    @property
    def passed(self) -> bool:
        return self.report.ok and not self.blamed_slow

    @property
    def reason(self) -> str:
        problems = [f"{r.name}: {r.reason}" for r in self.report.failed]
        if self.blamed_slow and self.pairwise:
            problems.append(f"slow in every pairing ({', '.join(self.blamed_slow)}; more than "
                            f"{self.pairwise_factor:g}x the median pair's {self.pairwise.baseline_seconds:g} s)")
        return "; ".join(problems) or f"{len(self.report.checks)} checks passed"

    def fault_line(self) -> str:
        """The one line a failed gate logs, in the form the catalog's ``host.preflight-failed`` rule knows."""
        return f"kcover preflight: node {self.report.node or 'unknown'} failed: {self.reason}"

    def to_dict(self) -> dict[str, object]:
        data = self.report.to_dict()
        data["passed"] = self.passed
        data["pairwise"] = self.pairwise.to_dict() if self.pairwise else None
        return data


def run_preflight(
    *,
    config: HealthConfig | Path | str | None = None,
    suite: str = "quick",
    only: tuple[str, ...] = (),
    skip: tuple[str, ...] = (),
    checkpoint_dir: Path | None = None,
    simulate_nodes: int = 0,
    pairwise: PairwiseSpec | None = None,
    across_nodes: bool = False,
    node: str | None = None,
    nvml: NvmlApi | None = None,
) -> PreflightResult:
    """Run the pre-flight suite here, and the pairwise test over ``simulate_nodes`` local nodes (if ≥ 2)
    or, with ``across_nodes``, as this node's part of the test across the job's nodes.

    ``checkpoint_dir`` is where the storage checks write (the job's ``KCOVER_CHECKPOINT_DIR``).
    Raises :class:`~kcover.health.config.HealthConfigError` for a bad configuration, ``KeyError``
    for an unknown check name; a failing or broken check only makes ``passed`` false.
    """
    cfg = config if isinstance(config, HealthConfig) else load_config(config, known_checks=registry.names())
    if checkpoint_dir is not None:
        cfg = cfg.model_copy(update={"storage": cfg.storage.model_copy(update={"path": str(checkpoint_dir)})})
    if suite not in cfg.suites:
        raise KeyError(f"unknown suite {suite!r}; configured: {', '.join(sorted(cfg.suites))}")
    names = select_checks(cfg.suites[suite], only, skip)
    ctx = CheckContext(cfg, nvml=(lambda: nvml) if nvml is not None else None)
    report = run_checks(names, ctx, node=node)
    spec = pairwise or PairwiseSpec()
    result: PairwiseResult | None = None
    if across_nodes:
        result = pairwise_across_nodes(report.node, spec)
    else:
        result = simulate_pairwise(simulate_nodes, spec) if simulate_nodes >= 2 else None
    return PreflightResult(report, result, across_nodes=across_nodes, pairwise_factor=spec.factor)
