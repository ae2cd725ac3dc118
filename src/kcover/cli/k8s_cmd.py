"""``kcover agent``, ``kcover operator`` and ``kcover status``: the Kubernetes side of the CLI.

All three read a kubeconfig (``--kubeconfig`` or ``KUBECONFIG``) or, inside a
pod, the service account.  They need the ``kcover[k8s]`` extra.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from pathlib import Path
from typing import Annotated, Any

import typer

from kcover.cli.usage import UsageError, port, seconds, whole_number
from kcover.collect.printable import json_text


def connect_kubernetes(kubeconfig: Path | None) -> Any:
    try:
        from kubernetes import client, config
    except ImportError:
        raise UsageError("this command needs the Kubernetes client: pip install 'kcover[k8s]'") from None
    if kubeconfig is not None:
        os.environ["KUBECONFIG"] = str(kubeconfig)  # kopf's login reads it too
    try:  # as kubectl: --kubeconfig, KUBECONFIG, ~/.kube/config; in a pod, its service account
        default = Path(config.KUBE_CONFIG_DEFAULT_LOCATION).expanduser()
        if kubeconfig is not None or os.environ.get("KUBECONFIG") or default.exists():
            config.load_kube_config(config_file=str(kubeconfig) if kubeconfig else None)
        else:
            config.load_incluster_config()
    except (config.ConfigException, OSError) as error:
        raise UsageError(f"cannot load Kubernetes credentials: {error}") from None
    return client.ApiClient()


def agent(
    node: Annotated[str, typer.Option(envvar="NODE_NAME", help="This node's name (downward API).")],
    log_root: Annotated[Path, typer.Option(help="Root of the CRI container logs.")] = Path("/var/log/pods"),
    kmsg: Annotated[Path | None, typer.Option(help="Kernel log device or file; '' to disable.")]
    = Path("/dev/kmsg"),
    state_dir: Annotated[Path, typer.Option(help="Where offsets survive restarts (hostPath).")]
    = Path("/var/lib/kcover"),
    kubeconfig: Annotated[Path | None, typer.Option(help="Kubeconfig (default: in-cluster).")] = None,
    health_interval: Annotated[float, typer.Option(help="Seconds between periodic health-check runs; 0 = off "
                                                        "(suites requested with `kcover check --node` still run).",
                                                   callback=seconds(zero="off"))]
    = 300.0,
    health_suite: Annotated[str, typer.Option(help="Health suite to run periodically.")] = "quick",
    health_config: Annotated[Path | None, typer.Option(help="Health thresholds file (merged over defaults).")]
    = None,
    release_after: Annotated[int, typer.Option(help="Passing runs before kcover releases its quarantine.",
                                               callback=whole_number(1))] = 3,
    metrics_port: Annotated[int | None, typer.Option(help="Serve Prometheus metrics on this port.",
                                                     callback=port())] = None,
    snapshot_dir: Annotated[Path | None, typer.Option(help="The node's checkpoint-snapshot folder (the trainers' "
                                                           "KCOVER_SHARED_MEMORY hostPath) to free memory in.")]
    = None,
    snapshot_max_age: Annotated[float, typer.Option(help="Seconds without a save after which a snapshot there "
                                                         "is deleted.", callback=seconds())] = 86400.0,
) -> None:
    """Node agent: classify container and kernel logs, run health checks, report to the API."""
    from kcover.k8s.agent.loop import Agent

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    api = connect_kubernetes(kubeconfig)
    kernel = kmsg if kmsg is not None and str(kmsg) not in ("", ".") and kmsg.exists() else None
    from kcover.health import HealthConfigError
    from kcover.k8s.agent.health import HealthLoop

    try:  # periodic runs only with an interval; suites requested with `kcover check --node` always
        health = HealthLoop(api, node, health_interval, health_suite, health_config, release_after)
    except (HealthConfigError, ValueError, KeyError) as error:
        raise UsageError(str(error)) from None
    if metrics_port:
        from prometheus_client import start_http_server

        start_http_server(metrics_port)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    threading.Thread(target=health.run, args=(stop,), name="health", daemon=True).start()
    if snapshot_dir is not None:
        from kcover.k8s.agent.snapshots import sweep_forever

        threading.Thread(target=sweep_forever, args=(snapshot_dir, snapshot_max_age, stop), name="snapshots",
                         daemon=True).start()
    Agent(api, node, log_root, kernel, state_dir).run(stop)


def operator(
    namespace: Annotated[str, typer.Option(envvar="POD_NAMESPACE", help="The operator's namespace (Lease, "
                                                                         "cluster-wide RecoveryPolicy).")]
    = "kcover-system",
    identity: Annotated[str, typer.Option(envvar="POD_NAME", help="This replica's identity for the Lease.")]
    = "kcover-operator",
    lease_seconds: Annotated[float, typer.Option(help="Leader lease duration (whole seconds, at least 1).",
                                                 callback=seconds(least=1))] = 15.0,
    metrics_port: Annotated[int | None, typer.Option(help="Serve Prometheus metrics on this port.",
                                                     callback=port())] = None,
    kubeconfig: Annotated[Path | None, typer.Option(help="Kubeconfig (default: in-cluster).")] = None,
) -> None:
    """Recovery operator: restart, quarantine or fail opted-in jobs by their root cause."""
    connect_kubernetes(kubeconfig)
    from kcover.k8s.operator.main import Config, run

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    run(Config(namespace=namespace, identity=identity, lease_seconds=lease_seconds, metrics_port=metrics_port))


def status(
    kubeconfig: Annotated[Path | None, typer.Option(help="Kubeconfig (default: KUBECONFIG).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Opted-in jobs (state, restarts, last root cause) and the nodes kcover quarantined."""
    from kcover.k8s.status import collect_status, print_status

    api = connect_kubernetes(kubeconfig)
    report = collect_status(api)
    if as_json:
        typer.echo(json_text(report))
    else:
        print_status(report)
