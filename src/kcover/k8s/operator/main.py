"""The operator process: kopf watches pods and jobs and feeds them to the reconciler.

kopf keeps resilient watches on pods and on the three job kinds (event
handlers only: kcover adds no finalizers and no bookkeeping to users' objects).
Each event refreshes the in-memory :class:`~kcover.k8s.operator.reconcile.World`
and marks the job dirty; one task, on the replica holding the leader Lease,
lets the :class:`~kcover.k8s.operator.reconcile.Reconciler` judge dirty jobs
after a short settle (so the cascade of pod failures of one incident is judged
once, with all its evidence).  Everything the operator decides is in
:mod:`~kcover.k8s.operator.reconcile`; this module only wires kopf, the Lease and
the real clock to it.  Handlers are registered on a registry built per
:func:`run`, not at import time.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
from dataclasses import dataclass
from typing import Any, cast

import kopf
from kubernetes import client

from kcover.classify.matcher import default_matcher
from kcover.health.quarantine.kube import KubeQuarantine
from kcover.k8s.kinds import KINDS
from kcover.k8s.operator.actuate import Actuator
from kcover.k8s.operator.ettr import EttrCollector
from kcover.k8s.operator.leader import LeaderElection
from kcover.k8s.operator.reconcile import Reconciler, SystemClock, World
from kcover.k8s.operator.views import job_view, pod_view

log = logging.getLogger("kcover.operator")
TICK_SECONDS = 0.1
RECREATE_POLL = 0.5  # while a replaced Job waits to be created again
RECREATE_SWEEP = 10.0  # otherwise (a leader that died may have left one)


@dataclass(frozen=True)
class Config:
    namespace: str = "kcover-system"
    identity: str = "kcover-operator"
    lease_seconds: float = 15.0
    metrics_port: int | None = None


def failpoint(name: str) -> None:
    """Die here, as a crash would, when ``KCOVER_OPERATOR_FAILPOINT`` names this point (for crash tests)."""
    if os.environ.get("KCOVER_OPERATOR_FAILPOINT") == name:
        log.warning("failpoint %s: exiting", name)
        os._exit(86)


def build_registry(config: Config, world: World) -> kopf.OperatorRegistry:
    """kopf's handlers for one operator: watches that fill ``world``, and the evaluation task at start-up."""
    registry = kopf.OperatorRegistry()
    rules = default_matcher().rules
    remediations = {rule.id: rule.spec.remediation.strip() for rule in rules}
    clock = SystemClock()

    @kopf.on.startup(registry=registry)
    async def _startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.posting.enabled = False
        settings.watching.server_timeout = 60
        asyncio.get_running_loop().create_task(_evaluate_forever(config, world, rules))

    @kopf.on.login(registry=registry)
    def _login(**kwargs: Any) -> Any:
        if os.environ.get("KUBECONFIG"):
            return kopf.login_with_kubeconfig(**kwargs)
        return in_cluster_address(kopf.login_with_service_account(**kwargs))

    @kopf.on.event("", "v1", "pods", registry=registry)
    def _on_pod(type: str, body: kopf.Body, **_: Any) -> None:
        view = pod_view(body, remediations)
        if type == "DELETED":
            world.pods.pop(view.uid, None)
        elif view.job is not None:
            world.pods[view.uid] = view
        if view.job is not None:
            world.mark((view.job[0], view.namespace, view.job[1]), clock.monotonic())

    def on_job(kind: str) -> Any:
        def handler(type: str, body: kopf.Body, **_: Any) -> None:
            view = job_view(kind, body)
            if type == "DELETED":
                world.job_deleted(view.key, clock.monotonic())
                return
            world.job_seen(view)
            if view.opted_in:
                world.mark(view.key, clock.monotonic())

        return handler

    for kind in KINDS.values():
        kopf.on.event(kind.group, kind.version, kind.plural, registry=registry)(on_job(kind.kind))
    return registry


async def _evaluate_forever(config: Config, world: World, rules: Any) -> None:
    api = client.ApiClient()
    clock = SystemClock()
    reconciler = Reconciler(world, Actuator(api, KubeQuarantine(client.CoreV1Api(api))), clock, rules,
                            namespace=config.namespace, failpoint=failpoint)
    leader = LeaderElection(api, config.namespace, config.identity, duration=config.lease_seconds)
    renewed = swept = 0.0
    while True:
        now = clock.monotonic()
        if now - renewed >= config.lease_seconds / 3 or not leader.leader:
            await asyncio.to_thread(leader.tick)
            renewed = now
        if leader.leader and now - swept >= (RECREATE_POLL if world.recreating else RECREATE_SWEEP):
            swept = now
            try:
                await asyncio.to_thread(reconciler.finish_replacements)
            except Exception:
                log.exception("creating replaced Jobs again failed")
        if leader.leader:
            await asyncio.to_thread(reconciler.evaluate_due)
        await asyncio.sleep(TICK_SECONDS)


def in_cluster_address(info: kopf.ConnectionInfo | None) -> kopf.ConnectionInfo | None:
    """Reach the API server where the pod's environment says, as client-go and the kubernetes client do.

    kopf's service-account login names ``kubernetes.default.svc``, which needs the cluster's DNS: an
    operator that recovers jobs must not stop when DNS does (and the real-node test cluster has none).
    """
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
    if info is None or not host or not port:
        return info
    server = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
    return dataclasses.replace(info, server=server)


def run(config: Config) -> None:
    """Run the operator until interrupted (``kcover operator``)."""
    world = World()
    if config.metrics_port:
        from prometheus_client import REGISTRY, start_http_server

        REGISTRY.register(EttrCollector(lambda: (list(world.jobs.values()), list(world.pods.values()))))
        start_http_server(config.metrics_port)
    # An explicit identity: kopf would otherwise ask the password database who runs it, and the image's
    # user 65532 is not in it (KeyError: getpwuid(), found by the chart test on real nodes).
    kopf.run(registry=build_registry(config, world), clusterwide=True, standalone=True,
             identity=cast(Any, config.identity))  # kopf types it as a NewType of str it does not export
