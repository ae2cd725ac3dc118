"""``kcover history``: past runs of ``kcover run`` and their faults, from the state database."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from kcover.launcher.history import History


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
        raise typer.Exit(2)
    store = History(database)
    try:
        if run is not None:
            faults = store.faults(run)
            if as_json:
                typer.echo(json.dumps(faults, indent=2))
                return
            table = Table(title=f"faults of run {run}", box=None, header_style="bold")
            for column in ("attempt", "rule", "category", "role", "rank", "node", "count", "line"):
                table.add_column(column, overflow="ellipsis", no_wrap=column != "line")
            for fault in faults:
                table.add_row(*("" if fault[k] is None else str(fault[k]) for k in
                                ("attempt", "rule", "category", "role", "rank", "node", "count", "line")))
            Console().print(table)
            return
        runs = store.runs(limit)
        if as_json:
            typer.echo(json.dumps([vars(r) for r in runs], indent=2))
            return
        table = Table(box=None, header_style="bold")
        for column in ("run", "started", "status", "restarts", "root cause", "ETTR", "command"):
            table.add_column(column, overflow="ellipsis")
        for row in runs:
            started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(row.started))
            cause = f"{row.root_category} ({row.root_rule})" if row.root_category else ""
            ettr = "" if row.ettr is None else f"{row.ettr:.2f}"
            table.add_row(str(row.id), started, row.status, str(row.restarts), cause, ettr,
                          " ".join(json.loads(row.command)))
        Console().print(table)
    finally:
        store.close()
