"""The agent's periodic health checks: run the quick suite, then quarantine or release the node.

Every ``interval`` seconds (in its own thread, so log classification never
waits on a check) the agent runs a suite of :mod:`kcover.health` checks on its
node and hands the report to the shared quarantine
(:class:`~kcover.health.quarantine.kube.KubeQuarantine`): a failure sets
``KcoverHealthy=False`` and quarantines the node; a node kcover quarantined is
released after ``release_after`` consecutive passing runs.  Each run's results
are exported as Prometheus metrics (``--metrics-port``).

On demand: ``kcover check --node N --suite full`` sets the node annotation
``kcover.io/health-request: <suite>/<id>``; the agent watches its own Node
object, runs that suite next (also when periodic runs are off), records the
results with the id in ``kcover.io/health`` — through the same quarantine
path — and removes the request (only if it is still the same one).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from pathlib import Path

from kubernetes import client, watch
from prometheus_client import Counter, Gauge

from kcover.health import CheckContext, load_config, run_checks, select_checks
from kcover.health.model import HealthReport
from kcover.health.quarantine.kube import KubeQuarantine
from kcover.health.quarantine.policy import ANNOTATION_HEALTH_REQUEST, NodeAction, QuarantinePolicy
from kcover.health.registry import names as check_names
from kcover.k8s.health_request import health_record, withdraw_request

log = logging.getLogger("kcover.agent.health")

CHECK_STATUS = Gauge("kcover_health_check_status",
                     "Last result of each health check (1 pass/warn/skipped, 0 fail/error)", ["node", "check"])
CHECK_SECONDS = Gauge("kcover_health_check_seconds", "Duration of each health check's last run", ["node", "check"])
RUNS = Counter("kcover_health_runs_total", "Health-suite runs, by whether any check failed", ["node", "failed"])
QUARANTINED = Gauge("kcover_node_quarantined", "1 while kcover keeps this node quarantined", ["node"])
WATCH_SECONDS = 300
RETRY_SECONDS = 5.0


class HealthLoop:
    """Runs the periodic suite every ``interval`` seconds (0: never) and any suite requested on the node."""

    def __init__(self, api: client.ApiClient, node: str, interval: float, suite: str = "quick",
                 config: Path | None = None, release_after: int = 3, env: dict[str, str] | None = None) -> None:
        self.node = node
        self.interval = interval
        self.config = load_config(config, known_checks=check_names())
        if suite not in self.config.suites:
            raise ValueError(f"unknown health suite {suite!r}; known: {', '.join(sorted(self.config.suites))}")
        self.suite = suite
        self.env = env
        self.core = client.CoreV1Api(api)
        self.quarantine = KubeQuarantine(self.core, QuarantinePolicy(release_after_passes=release_after))
        self.runs = 0
        self.requests = RequestWatch(self.core, node)

    def run_once(self, suite: str | None = None, request: str | None = None) -> HealthReport:
        suite = suite or self.suite
        checks = select_checks(self.config.suites[suite])
        report = run_checks(checks, CheckContext(self.config, env=self.env), node=self.node)
        decision = self.quarantine.observe(self.node, report, suite, request)
        self.runs += 1
        failed = {result.name for result in report.failed}
        for result in report.checks:
            CHECK_STATUS.labels(self.node, result.name).set(0 if result.name in failed else 1)
            CHECK_SECONDS.labels(self.node, result.name).set(result.seconds)
        RUNS.labels(self.node, str(bool(failed)).lower()).inc()
        QUARANTINED.labels(self.node).set(1 if decision.action in (NodeAction.QUARANTINE, NodeAction.KEEP) else 0)
        log.info("health run %d (%s suite%s) on %s: %s failed; %s (%s)", self.runs, suite,
                 f", request {request}" if request else "", self.node, len(report.failed), decision.action.value,
                 decision.reason)
        return report

    def answer(self, value: str) -> None:
        """Run the suite a ``kcover.io/health-request`` asks for, record the answer, withdraw the request."""
        suite, _, request = value.partition("/")
        try:
            if suite in self.config.suites:
                self.run_once(suite, request or None)
            else:
                known = ", ".join(sorted(self.config.suites))
                self._refuse(request, f"unknown health suite {suite!r}; known: {known}", usage=True)
        except Exception as exc:
            self._refuse(request, f"the {suite} suite could not run: {exc}", usage=False)  # nobody left waiting
            raise
        finally:
            self.requests.withdraw(value)

    def _refuse(self, request: str, error: str, usage: bool) -> None:
        """Answer ``request`` with an error, on the last run's record (which `kcover status` keeps showing)."""
        last = health_record(self.core.read_node(self.node).metadata.annotations) or {}
        self.quarantine.record(self.node, {**last, "request": request, "error": error,
                                           "usage_error": usage})

    def run(self, stop: threading.Event) -> None:
        threading.Thread(target=self.requests.run, args=(stop,), name="health-requests", daemon=True).start()
        due = time.monotonic() if self.interval > 0 else math.inf
        while not stop.is_set():
            request = self.requests.take()
            periodic = request is None and time.monotonic() >= due
            try:
                if request is not None:
                    self.answer(request)
                elif periodic:
                    self.run_once()
            except Exception:
                log.exception("health run failed")
            if periodic:
                due = time.monotonic() + self.interval
            self.requests.wait(min(1.0, max(0.0, due - time.monotonic())))


class RequestWatch:
    """Watches this node for ``kcover.io/health-request`` and hands each new value to the health loop once."""

    def __init__(self, core: client.CoreV1Api, node: str) -> None:
        self.core = core
        self.node = node
        self._pending: str | None = None
        self._taken: str | None = None
        self._lock = threading.Lock()
        self._wake = threading.Event()

    def offer(self, value: str | None) -> None:
        with self._lock:
            if value is None or value == self._taken:
                return
            self._pending = value
        self._wake.set()

    def take(self) -> str | None:
        with self._lock:
            value, self._pending = self._pending, None
            if value is not None:
                self._taken = value
            self._wake.clear()
            return value

    def wait(self, seconds: float) -> None:
        self._wake.wait(seconds)

    def withdraw(self, value: str) -> None:
        withdraw_request(self.core, self.node, value)

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                for event in watch.Watch().stream(self.core.list_node, field_selector=f"metadata.name={self.node}",
                                                  timeout_seconds=WATCH_SECONDS):
                    annotations = event["object"].metadata.annotations or {}
                    self.offer(annotations.get(ANNOTATION_HEALTH_REQUEST))
                    if stop.is_set():
                        return
            except Exception as exc:  # the API server restarted, a 403 from a narrow role: say so, retry
                log.warning("watching node %s for health requests: %s", self.node, exc)
                stop.wait(RETRY_SECONDS)
