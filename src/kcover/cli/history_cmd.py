"""``kcover history``: past runs of ``kcover run`` and their faults, from the state database.

It only reads: the database is opened read-only, never created, changed or
moved.  A locked, unreadable or damaged database is an error (exit 1) that names
the file; a run whose launcher is gone shows as ``lost``.
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from kcover.collect.printable import json_text, printable
from kcover.exit_codes import ExitCode
from kcover.launcher.history import History, HistoryError


def history(
    state_dir: Annotated[Path, typer.Option(help="The state dir of the runs.")] = Path(".kcover"),
    run: Annotated[int | None, typer.Option(help="Show the faults of this run.")] = None,
    limit: Annotated[int, typer.Option(help="How many runs to list.")] = 20,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """List runs (status, restarts, root cause, ETTR), or one run's faults."""
    database = state_dir / "kcover.db"
    if not database.exists():
        typer.echo(f"kcover: no run history in {state_dir} (no kcover.db)", err=True)
        raise typer.Exit(ExitCode.USAGE)
    try:
        store = History(database, read_only=True)
    except HistoryError as exc:
        typer.echo(f"kcover: {exc}", err=True)
        raise typer.Exit(ExitCode.FAILED) from None
    try:
        _show(store, run, limit, as_json)
    except sqlite3.Error as exc:
        typer.echo(f"kcover: cannot read state database {database}: {exc}", err=True)
        raise typer.Exit(ExitCode.FAILED) from None
    finally:
        store.close()


def _show(store: History, run: int | None, limit: int, as_json: bool) -> None:
    if run is not None:
        _show_faults(store, run, as_json)
        return
    runs = store.runs(limit)
    if as_json:
        typer.echo(json_text([vars(r) for r in runs]))
        return
    table = Table(box=None, header_style="bold")
    for column in ("run", "started", "status", "restarts", "root cause", "ETTR", "command"):
        table.add_column(column, overflow="ellipsis")
    for row in runs:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(row.started))
        cause = f"{row.root_category} ({row.root_rule})" if row.root_category else ""
        ettr = "" if row.ettr is None else f"{row.ettr:.2f}"
        _add_text_row(table, str(row.id), started, row.status, str(row.restarts), cause, ettr,
                      " ".join(json.loads(row.command)))
    Console().print(table)


def _show_faults(store: History, run: int, as_json: bool) -> None:
    faults = store.faults(run)
    if as_json:
        typer.echo(json_text(faults))
        return
    columns = ("attempt", "rule", "category", "role", "rank", "node", "count", "line")
    table = Table(title=f"faults of run {run}", box=None, header_style="bold")
    for column in columns:
        table.add_column(column, overflow="ellipsis", no_wrap=column != "line")
    for fault in faults:
        _add_text_row(table, *("" if fault[k] is None else str(fault[k]) for k in columns))
    Console().print(table)


def _add_text_row(table: Table, *cells: str) -> None:
    """Cells as plain text: a command or log line with ``[`` or ESC is shown, never read as markup."""
    table.add_row(*(Text(printable(cell)) for cell in cells))
