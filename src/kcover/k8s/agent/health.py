"""The agent's periodic health checks: run the quick suite, then quarantine or release the node.

Every ``interval`` seconds (in its own thread, so log classification never
waits on a check) the agent runs a suite of :mod:`kcover.health` checks on its
node and hands the report to the shared quarantine
(:class:`~kcover.health.quarantine.kube.KubeQuarantine`): a failure sets
``KcoverHealthy=False`` and quarantines the node; a node kcover quarantined is
released after ``release_after`` consecutive passing runs.  Each run's results
are exported as Prometheus metrics (``--metrics-port``).
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from kubernetes import client
from prometheus_client import Counter, Gauge

from kcover.health import CheckContext, load_config, run_checks, select_checks
from kcover.health.model import HealthReport
from kcover.health.quarantine.kube import KubeQuarantine
from kcover.health.quarantine.policy import QuarantinePolicy, Verdict
from kcover.health.registry import names as check_names

log = logging.getLogger("kcover.agent.health")

CHECK_STATUS = Gauge("kcover_health_check_status",
                     "Last result of each health check (1 pass/warn/skipped, 0 fail/error)", ["node", "check"])
CHECK_SECONDS = Gauge("kcover_health_check_seconds", "Duration of each health check's last run", ["node", "check"])
RUNS = Counter("kcover_health_runs_total", "Health-suite runs, by whether any check failed", ["node", "failed"])
QUARANTINED = Gauge("kcover_node_quarantined", "1 while kcover keeps this node quarantined", ["node"])


class HealthLoop:
    def __init__(self, api: client.ApiClient, node: str, interval: float, suite: str = "quick",
                 config: Path | None = None, release_after: int = 3, env: dict[str, str] | None = None) -> None:
        self.node = node
        self.interval = interval
        self.config = load_config(config, known_checks=check_names())
        if suite not in self.config.suites:
            raise ValueError(f"unknown health suite {suite!r}; known: {', '.join(sorted(self.config.suites))}")
        self.checks = select_checks(self.config.suites[suite])
        self.env = env
        self.quarantine = KubeQuarantine(client.CoreV1Api(api), QuarantinePolicy(release_after_passes=release_after))
        self.runs = 0

    def run_once(self) -> HealthReport:
        report = run_checks(self.checks, CheckContext(self.config, env=self.env), node=self.node)
        decision = self.quarantine.observe(self.node, report)
        self.runs += 1
        failed = {result.name for result in report.failed}
        for result in report.checks:
            CHECK_STATUS.labels(self.node, result.name).set(0 if result.name in failed else 1)
            CHECK_SECONDS.labels(self.node, result.name).set(result.seconds)
        RUNS.labels(self.node, str(bool(failed)).lower()).inc()
        QUARANTINED.labels(self.node).set(1 if decision.verdict in (Verdict.QUARANTINE, Verdict.KEEP) else 0)
        log.info("health run %d on %s: %s failed; %s (%s)", self.runs, self.node, len(report.failed),
                 decision.verdict.value, decision.reason)
        return report

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self.run_once()
            except Exception:
                log.exception("health run failed")
            stop.wait(self.interval)
