"""Rendering verdicts for people: a compact rich table plus the verdict in a few lines.

Colour only on a terminal (rich decides); plain text in pipes and files.
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from kcover.faults import Action, Role, Verdict

_ACTION_STYLE = {
    Action.NONE: "green",
    Action.RESTART: "yellow",
    Action.RESTART_EXCLUDING_NODES: "bold yellow",
    Action.FAIL: "bold red",
}
MAX_ROWS = 30


def print_verdict(verdict: Verdict, console: Console | None = None) -> None:
    console = console or Console(highlight=False, soft_wrap=False)
    if verdict.faults:
        table = Table(title=f"{len(verdict.faults)} distinct fault(s)", title_justify="left")
        for column in ("where", "line", "category", "rule", "role", "count", "evidence"):
            table.add_column(column, overflow="fold" if column == "evidence" else "ellipsis")
        for fault in verdict.faults[:MAX_ROWS]:
            where = fault.evidence.source
            if fault.rank is not None:
                where += f" rank {fault.rank}"
            if fault.node:
                where += f" ({fault.node})"
            marker = "[bold]" if fault is verdict.root else ""
            table.add_row(
                where,
                str(fault.evidence.line_number or ""),
                f"{marker}{fault.category.value}",
                fault.rule,
                "root" if fault.role is Role.ROOT else "cascade",
                str(fault.count),
                fault.evidence.line[:160],
            )
        if len(verdict.faults) > MAX_ROWS:
            table.caption = f"… {len(verdict.faults) - MAX_ROWS} more (use --json for all)"
        console.print(table)
    style = _ACTION_STYLE[verdict.action]
    if verdict.root is None:
        console.print("[green]verdict:[/] no fault found — action [bold]none[/]")
        return
    root = verdict.root
    console.print(f"[bold]root cause:[/] {root.category.value} — {verdict.reason}")
    if verdict.nodes:
        console.print(f"[bold]blamed nodes:[/] {', '.join(verdict.nodes)}")
    if verdict.ranks:
        console.print(f"[bold]ranks:[/] {', '.join(map(str, verdict.ranks))}")
    console.print(f"[bold]action:[/] [{style}]{verdict.action.value}[/]")
    console.print(f"[bold]what to do:[/] {root.remediation}")
