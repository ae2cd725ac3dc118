"""The live view of ``kcover demo``: per-rank progress bars and the stream of kcover's decisions.

A :class:`LiveReporter` is an ordinary launcher reporter (events + progress)
that draws with ``rich.live`` instead of printing lines; on a non-terminal it
falls back to plain event lines, so ``make demo | cat`` stays readable.
"""

from __future__ import annotations

import time
from types import TracebackType

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from kcover.launcher.reporting import ConsoleReporter

STYLE = {
    "fault": "red", "exit": "red", "hang": "bold red", "verdict": "bold yellow", "decision": "bold cyan",
    "stop": "magenta", "start": "green", "inject": "bold magenta", "evidence": "dim",
}
MAX_EVENTS = 14


class LiveReporter:
    def __init__(self, total_steps: int, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True)
        self.total = total_steps
        self.steps: dict[int, int] = {}
        self.events: list[tuple[float, str, str]] = []
        self.began = time.monotonic()
        self.status = "starting"
        self.plain = ConsoleReporter() if not self.console.is_terminal else None
        self.live = Live(self._render(), console=self.console, refresh_per_second=8, transient=False)

    def __enter__(self) -> LiveReporter:
        if self.plain is None:
            self.live.__enter__()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        if self.plain is None:
            self.live.update(self._render())
            self.live.__exit__(kind, error, trace)

    def event(self, kind: str, text: str) -> None:
        if self.plain is not None:
            self.plain.event(kind, text)
            return
        self.events.append((time.monotonic() - self.began, kind, text))
        if kind == "start":
            self.steps.clear()
            self.status = text
        self.live.update(self._render())

    def progress(self, rank: int, step: int) -> None:
        self.steps[rank] = step
        if self.plain is None:
            self.live.update(self._render())

    def _render(self) -> Group:
        bars = Table.grid(padding=(0, 1))
        bars.add_column(justify="right")
        bars.add_column(width=40)
        bars.add_column()
        for rank in sorted(self.steps):
            bars.add_row(f"rank {rank}", ProgressBar(total=self.total, completed=self.steps[rank], width=40),
                         f"step {self.steps[rank]}/{self.total}")
        log = Text()
        for at, kind, text in self.events[-MAX_EVENTS:]:
            log.append(f"{at:6.1f}s ", style="dim")
            log.append(f"{kind:>9} ", style=STYLE.get(kind, ""))
            log.append(text[: max(40, self.console.width - 24)] + "\n")
        return Group(Panel(bars, title=f"kcover demo — {self.status}", title_align="left"),
                     Panel(log, title="what kcover saw and did", title_align="left"))
