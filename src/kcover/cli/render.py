"""Rendering verdicts for people: one table row per rule, then the verdict in a few lines.

Faults of the same rule are folded into one row ("7 ranks on 4 nodes"), roots
first, so a 1,000-rank cascade still reads in one screen.  Colour only on a
terminal (rich decides); plain text in pipes and files.  Everything that came
from the logs or their paths (sources, nodes, evidence lines) is shown as text,
never as rich markup, with control characters escaped (:func:`printable`): a
log line or file name must not restyle or rewrite the user's terminal.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from kcover.collect.printable import printable
from kcover.faults import Action, Fault, Role, Verdict

_ACTION_STYLE = {
    Action.NONE: "green",
    Action.RESTART: "yellow",
    Action.RESTART_EXCLUDING_NODES: "bold yellow",
    Action.FAIL: "bold red",
}
MAX_ROWS = 20


def _where(faults: Sequence[Fault]) -> str:
    ranks = sorted({f.rank for f in faults if f.rank is not None})
    nodes = sorted({f.node for f in faults if f.node})
    sources = {f.evidence.source for f in faults}
    if len(ranks) == 1:
        text = f"rank {ranks[0]}"
    elif ranks:
        text = f"{len(ranks)} ranks"
    else:
        text = next(iter(sources)) if len(sources) == 1 else f"{len(sources)} logs"
    if len(nodes) == 1:
        text += f" ({nodes[0]})"
    elif nodes:
        text += f" on {len(nodes)} nodes"
    return text


def _shown(text: str) -> str:
    """Outside text for a markup string: control characters escaped, markup brackets made literal."""
    return escape(printable(text))


def _grouped(verdict: Verdict) -> list[list[Fault]]:
    groups: dict[str, list[Fault]] = {}
    for fault in verdict.faults:
        groups.setdefault(fault.rule, []).append(fault)
    root_rule = verdict.rule
    return sorted(
        groups.values(),
        key=lambda g: (g[0].rule != root_rule, g[0].role is not Role.ROOT, -g[0].priority),
    )


def print_verdict(verdict: Verdict, console: Console | None = None) -> None:
    console = console or Console(highlight=False)
    if verdict.faults:
        table = Table(box=None, header_style="bold", pad_edge=False, expand=True)
        table.add_column("role", no_wrap=True, min_width=7)
        table.add_column("category", no_wrap=True, min_width=14)
        table.add_column("rule", no_wrap=True, min_width=14)
        table.add_column("where", no_wrap=True, min_width=10)
        table.add_column("count", justify="right", no_wrap=True)
        table.add_column("first line", no_wrap=True, overflow="ellipsis", ratio=1)
        groups = _grouped(verdict)
        for group in groups[:MAX_ROWS]:
            first = group[0]
            is_root = first.rule == verdict.rule
            role = "ROOT" if is_root else first.role.value
            style = "bold red" if is_root else ("" if first.role is Role.ROOT else "dim")
            cells = (role, first.category.value, first.rule, _where(group), str(sum(f.count for f in group)),
                     first.evidence.line)
            table.add_row(*(Text(printable(cell)) for cell in cells), style=style)
        console.print(table)
        if len(groups) > MAX_ROWS:
            console.print(f"… {len(groups) - MAX_ROWS} more rules (use --json for all)")
        console.print()
    if verdict.root is None:
        console.print("[green]verdict:[/] no fault found — action [bold]none[/]")
        return
    root = verdict.root
    style = _ACTION_STYLE[verdict.action]
    console.print(f"[bold]root cause:[/]  {root.category.value} — {_shown(verdict.reason)}")
    if verdict.nodes:
        console.print(f"[bold]blamed node:[/] {_shown(', '.join(verdict.nodes))}")
    if verdict.ranks:
        console.print(f"[bold]ranks:[/]       {', '.join(map(str, verdict.ranks))}")
    console.print(f"[bold]action:[/]      [{style}]{verdict.action.value}[/]")
    console.print(f"[bold]what to do:[/]  {_shown(root.remediation)}")
