"""``kcover report``: one self-contained HTML page showing what happened to a run or a Kubernetes job.

Reads the state database read-only (like ``kcover history``) and writes the page
atomically, by default into the run's folder (``runs/<time>-<pid>/report.html``);
``--png`` also renders the timeline with headless Chromium.  ``--job NS/NAME``
reads a job's records from the cluster instead (like ``kcover status``: a
kubeconfig, or in a pod its service account; see :mod:`kcover.runreport.kube`)
into ``./report-<ns>-<name>.html``.  The path of every file written is printed
on stdout.  A missing database, an unknown run or job, a job not opted in, a
malformed ``--job`` or a bad ``-o`` is a usage error (exit 2); an unusable
database, an unreachable cluster, a failed write or a missing Chromium is exit
1, in one line on stderr.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

import typer

from kcover.cli.usage import UsageError
from kcover.collect.printable import printable
from kcover.exit_codes import ExitCode

NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
"""Kubernetes' rules for a namespace (a DNS label) and a job's name (a DNS subdomain)."""


def report(
    run: Annotated[int | None, typer.Argument(help="The run's number (see kcover history); default: the newest.",
                                              min=1, show_default=False)] = None,
    job: Annotated[str | None, typer.Option(help="A Kubernetes job, NAMESPACE/NAME, instead of a local run.",
                                            show_default=False)] = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="The HTML file to write (default: "
                                                "report.html in the run's folder; ./report-<ns>-<name>.html for a "
                                                "job).")] = None,
    png: Annotated[bool, typer.Option(help="Also write a PNG of the timeline (needs Chromium).")] = False,
    state_dir: Annotated[Path, typer.Option(help="The state dir of the runs.")] = Path(".kcover"),
    kubeconfig: Annotated[Path | None, typer.Option(help="Kubeconfig for --job (default: KUBECONFIG, "
                                                    "~/.kube/config, in a pod its service account).")] = None,
) -> None:
    """Write an HTML report of a run or a Kubernetes job: timeline, faults, verdicts, lost time and ETTR."""
    from kcover.runreport.output import ReportError

    try:
        written = _job_report(job, run, output, png, kubeconfig) if job is not None else \
            _run_report(state_dir, run, output, png)
    except ReportError as exc:
        if exc.code == ExitCode.USAGE:
            raise UsageError(printable(str(exc))) from None
        typer.echo(f"kcover: {printable(str(exc))}", err=True)
        raise typer.Exit(exc.code) from None
    for path in written:
        typer.echo(printable(str(path)))


def _run_report(state_dir: Path, run: int | None, output: Path | None, png: bool) -> list[Path]:
    from kcover.runreport.build import build_report

    database = state_dir / "kcover.db"
    if not database.exists():
        raise UsageError(f"no run history in {state_dir} (no kcover.db)")
    return build_report(database, run, output, png=png)


def _job_report(job: str, run: int | None, output: Path | None, png: bool, kubeconfig: Path | None) -> list[Path]:
    """``--job``: the name is checked before any cluster is asked anything."""
    from kcover.cli.k8s_cmd import connect_kubernetes

    if run is not None:
        raise UsageError(f"give a run ({run}) or --job, not both")
    namespace, name = parse_job(job)
    api = connect_kubernetes(kubeconfig)  # says so when the kcover[k8s] extra is missing
    from kcover.runreport.kube import report_job

    return report_job(api, namespace, name, output, png=png)


def parse_job(text: str) -> tuple[str, str]:
    """``NAMESPACE/NAME`` as (namespace, name), or a usage error naming what is wrong (the value cut short)."""
    shown = repr(text) if len(text) <= 80 else f"{text[:80]!r}… ({len(text):,} characters)"
    parts = text.split("/")
    if len(parts) != 2 or not all(parts):
        raise UsageError(f"--job {shown}: expected NAMESPACE/NAME, e.g. --job default/train")
    namespace, name = parts
    if not NAMESPACE.fullmatch(namespace):
        raise UsageError(f"--job {shown}: {namespace[:80]!r} is not a namespace (lowercase letters, digits and "
                         "'-', at most 63)")
    if not NAME.fullmatch(name):
        raise UsageError(f"--job {shown}: {name[:80]!r} is not a job name (lowercase letters, digits, '-' and "
                         "'.', at most 253)")
    return namespace, name


def announce_report(state_dir: Path, run_dir: str) -> None:
    """After ``kcover run`` or ``kcover demo``: write the run's report and say where (or, in one line, why not).

    Best effort: whatever happens here, the run's exit code stays what the run decided.
    """
    from kcover.runreport.build import report_after_run

    path, why = report_after_run(state_dir, run_dir)
    if path is not None:
        typer.echo(f"report: {printable(str(path))}", err=True)
    else:
        typer.echo(f"kcover: no report written ({printable(why)})", err=True)
