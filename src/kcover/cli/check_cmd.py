"""``kcover check`` and ``kcover preflight``: run the health checks from the command line.

``kcover check`` prints a table (or ``--json``: ``{"node", "checks": [...]}``)
and exits 0 when nothing failed, 1 when a check failed (or broke), 2 on a usage
error (unknown check, bad configuration).  With ``--node`` the suite runs on
that Kubernetes node, by its kcover agent (:mod:`kcover.k8s.health_request`),
and prints the same way.  ``kcover preflight`` is the same gate as
:func:`kcover.health.preflight.run_preflight`, meant for an init container.
Registered in :mod:`kcover.cli.main`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from kcover.cli.usage import UsageError, seconds, whole_number
from kcover.collect.printable import json_text, printable
from kcover.exit_codes import ExitCode
from kcover.health import registry
from kcover.health.config import HealthConfigError, load_config
from kcover.health.model import CheckResult, HealthReport, Status
from kcover.health.nvidia_smi import NvidiaSmiReportError, load_report
from kcover.health.nvml import NvmlApi
from kcover.health.pairwise import PairwiseSetupError
from kcover.health.preflight import PreflightResult, run_preflight
from kcover.health.registry import CheckContext
from kcover.health.runner import run_checks, select_checks

MAX_SIMULATED_NODES = 64  # local processes forked for --simulate-nodes
_COLOURS = {Status.PASS: "green", Status.WARN: "yellow", Status.FAIL: "red", Status.ERROR: "red", Status.SKIPPED: "dim"}

ConfigOption = Annotated[Path | None, typer.Option("--config", help="YAML merged over the default thresholds.")]
OnlyOption = Annotated[list[str] | None, typer.Option("--only", help="Run only these checks (or prefixes: gpu).")]
SkipOption = Annotated[list[str] | None, typer.Option("--skip", help="Leave out these checks (or prefixes).")]
SuiteOption = Annotated[str, typer.Option("--suite", help="Suite from the configuration: quick or full.")]
JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON object.")]
DirOption = Annotated[Path | None, typer.Option("--checkpoint-dir", help="Path the storage checks test.")]
ReportOption = Annotated[Path | None, typer.Option(
    "--nvidia-smi-xml", help="Judge the GPUs of a saved `nvidia-smi -q -x` report instead of this machine's.")]


def _line(result: CheckResult) -> str:
    value = "" if result.value is None else f"{result.value} {result.unit}".strip()
    limit = "" if result.threshold is None else f" (threshold {result.threshold})"
    colour = _COLOURS[result.status]
    return (  # a reason may quote a path or a device's answer: text, not markup
        f"[{colour}]{result.status.value:<7}[/{colour}] {escape(printable(result.name)):<22} "
        f"{escape(printable(value + limit))}  {escape(printable(result.reason))}  [dim]{result.seconds:.2f} s[/dim]"
    )


def _printer(enabled: bool) -> object:
    from rich.console import Console

    console = Console(stderr=False, highlight=False)
    return (lambda result: console.print(_line(result))) if enabled else None


def check(
    as_json: JsonOption = False,
    only: OnlyOption = None,
    skip: SkipOption = None,
    suite: SuiteOption = "quick",
    config: ConfigOption = None,
    checkpoint_dir: DirOption = None,
    nvidia_smi_xml: ReportOption = None,
    node: Annotated[str | None, typer.Option(
        "--node", help="Run the suite on this Kubernetes node, by its kcover agent, and wait for the result.")] = None,
    kubeconfig: Annotated[Path | None, typer.Option(help="With --node: kubeconfig (default: KUBECONFIG, "
                                                         "~/.kube/config, in-cluster).")] = None,
    timeout: Annotated[float, typer.Option(help="With --node: seconds to wait for the agent's answer.",
                                           callback=seconds())] = 900.0,
    list_checks: Annotated[bool, typer.Option("--list", help="List the registered checks and exit.")] = False,
) -> None:
    """Check this node's health: GPUs, DCGM, compute, collectives, storage, network."""
    if list_checks:
        for entry in registry.entries():
            typer.echo(f"{entry.name:<22} {entry.summary}")
        raise typer.Exit(ExitCode.SUCCESS)
    try:
        cfg = load_config(config, known_checks=registry.names())
        if suite not in cfg.suites:
            raise UsageError(f"unknown suite {suite!r}; configured: {', '.join(sorted(cfg.suites))}")
        names = select_checks(cfg.suites[suite], only or (), skip or ())
    except HealthConfigError as exc:
        raise UsageError(f"invalid health configuration: {exc}") from None
    except KeyError as exc:
        raise UsageError(str(exc.args[0])) from None
    if node is not None:
        if only or skip or nvidia_smi_xml or checkpoint_dir or config:
            raise UsageError("--node runs a whole suite as that node's agent is configured: "
                              "--only, --skip, --config, --checkpoint-dir and --nvidia-smi-xml do not apply")
        _check_remote(node, suite, kubeconfig, timeout, as_json)
    if checkpoint_dir is not None:
        cfg = cfg.model_copy(update={"storage": cfg.storage.model_copy(update={"path": str(checkpoint_dir)})})
    nvml: Callable[[], NvmlApi] | None = None
    if nvidia_smi_xml is not None:
        try:
            saved = load_report(nvidia_smi_xml)
        except NvidiaSmiReportError as exc:
            raise UsageError(str(exc)) from None
        nvml = lambda: saved  # noqa: E731
    printer = _printer(not as_json)
    report = run_checks(names, CheckContext(cfg, nvml=nvml), on_result=printer if callable(printer) else None)
    if as_json:
        typer.echo(json_text(report.to_dict()))
    else:
        _summary(report)
    raise typer.Exit(ExitCode.SUCCESS if report.ok else ExitCode.FAILED)


def _check_remote(node: str, suite: str, kubeconfig: Path | None, timeout: float, as_json: bool) -> None:
    """``kcover check --node``: the agent on ``node`` runs ``suite``; print its results like a local run."""
    from kcover.cli.k8s_cmd import connect_kubernetes

    api = connect_kubernetes(kubeconfig)  # first: without the k8s extra it says so and exits 2
    from kcover.k8s.health_request import NoSuchNodeError, request_suite

    try:
        record = request_suite(api, node, suite, timeout)
    except NoSuchNodeError as exc:
        raise UsageError(str(exc)) from None
    if record is None:
        typer.echo(f"kcover: no answer from the kcover agent on node {node} within {timeout:g} s (is it running "
                   "there?); the request was withdrawn", err=True)
        raise typer.Exit(ExitCode.FAILED)
    if record.get("error"):
        typer.echo(f"kcover: node {node}: {record['error']}", err=True)
        raise typer.Exit(ExitCode.USAGE if record.get("usage_error") else ExitCode.FAILED)
    report = HealthReport(node, tuple(
        CheckResult(c["name"], Status(c["status"]), c.get("reason", ""), c.get("value"), c.get("unit", ""),
                    c.get("threshold"), c.get("seconds", 0.0)) for c in record.get("checks", [])))
    if as_json:
        typer.echo(json_text({**report.to_dict(), "suite": suite, "at": record.get("at")}))
    else:
        printer = _printer(True)
        for result in report.checks:
            if callable(printer):
                printer(result)
        _summary(report)
    raise typer.Exit(ExitCode.SUCCESS if report.ok else ExitCode.FAILED)


def _summary(report: HealthReport) -> None:
    counts = {status: sum(1 for r in report.checks if r.status is status) for status in Status}
    seconds = sum(r.seconds for r in report.checks)
    parts = ", ".join(f"{n} {status.value}" for status, n in counts.items() if n)
    typer.echo(f"{report.node}: {parts} in {seconds:.1f} s")


def preflight(
    as_json: JsonOption = False,
    only: OnlyOption = None,
    skip: SkipOption = None,
    suite: SuiteOption = "quick",
    config: ConfigOption = None,
    checkpoint_dir: DirOption = None,
    simulate_nodes: Annotated[
        int, typer.Option("--simulate-nodes", help="Also run the pairwise slow-node test over N local nodes.",
                          callback=whole_number(2, MAX_SIMULATED_NODES, also=0, meaning="off"))
    ] = 0,
    pairwise: Annotated[
        bool,
        typer.Option("--pairwise", help="Also run the pairwise slow-node test across the job's nodes: one "
                     "`kcover preflight --pairwise` per node, meeting through torchrun's variables "
                     "(NODE_RANK or RANK, NNODES or WORLD_SIZE, MASTER_ADDR, MASTER_PORT)."),
    ] = False,
    node: Annotated[str | None, typer.Option("--node", envvar="NODE_NAME",
                                             help="This node's name (default: NODE_NAME, else the host name).")]
    = None,
) -> None:
    """Gate a job's start: exit 0 when this node may run it, 1 when not (for an init container).

    A refusal also logs one line, ``kcover preflight: node <name> failed: <why>``, which the catalog
    knows (``host.preflight-failed``): the kcover agent reports it, and the operator excludes the node.
    """
    try:
        result: PreflightResult = run_preflight(
            config=config,
            suite=suite,
            only=tuple(only or ()),
            skip=tuple(skip or ()),
            checkpoint_dir=checkpoint_dir,
            simulate_nodes=simulate_nodes,
            across_nodes=pairwise,
            node=node,
        )
    except HealthConfigError as exc:
        raise UsageError(f"invalid health configuration: {exc}") from None
    except (KeyError, PairwiseSetupError) as exc:
        raise UsageError(str(exc.args[0])) from None
    if as_json:
        typer.echo(json_text(result.to_dict()))
    else:
        printer = _printer(True)
        for item in result.report.checks:
            if callable(printer):
                printer(item)
        typer.echo(f"preflight {'passed' if result.passed else 'FAILED'}: {result.reason}")
    if not result.passed:
        typer.echo(result.fault_line(), err=True)
    raise typer.Exit(ExitCode.SUCCESS if result.passed else ExitCode.FAILED)
