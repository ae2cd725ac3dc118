"""``kcover report``: one self-contained HTML page showing what happened to a run.

Reads the state database read-only (like ``kcover history``) and writes the page
atomically, by default into the run's folder (``runs/<time>-<pid>/report.html``);
``--png`` also renders the timeline with headless Chromium.  The path of every
file written is printed on stdout.  A missing database, an unknown run or a bad
``-o`` is a usage error (exit 2); an unusable database, a failed write or a
missing Chromium is exit 1, in one line on stderr.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kcover.cli.usage import UsageError
from kcover.collect.printable import printable
from kcover.exit_codes import ExitCode


def report(
    run: Annotated[int | None, typer.Argument(help="The run's number (see kcover history); default: the newest.",
                                              min=1, show_default=False)] = None,
    job: Annotated[str | None, typer.Option(help="A Kubernetes job, NAMESPACE/NAME (not supported yet).")] = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="The HTML file to write "
                                                "(default: report.html in the run's folder).")] = None,
    png: Annotated[bool, typer.Option(help="Also write a PNG of the timeline (needs Chromium).")] = False,
    state_dir: Annotated[Path, typer.Option(help="The state dir of the runs.")] = Path(".kcover"),
) -> None:
    """Write an HTML report of a run: timeline, faults, verdicts, lost time and ETTR."""
    if job is not None:
        raise UsageError(f"--job {job}: reports of Kubernetes jobs are not supported yet; "
                         "report a local run with kcover report [RUN] --state-dir DIR")
    from kcover.runreport.build import build_report
    from kcover.runreport.output import ReportError

    database = state_dir / "kcover.db"
    if not database.exists():
        raise UsageError(f"no run history in {state_dir} (no kcover.db)")
    try:
        written = build_report(database, run, output, png=png)
    except ReportError as exc:
        if exc.code == ExitCode.USAGE:
            raise UsageError(str(exc)) from None
        typer.echo(f"kcover: {printable(str(exc))}", err=True)
        raise typer.Exit(exc.code) from None
    for path in written:
        typer.echo(printable(str(path)))


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
