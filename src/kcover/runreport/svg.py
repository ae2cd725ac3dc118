"""Small helpers that write SVG and HTML text: escaping, numbers, colours, a time axis.

Every string that reaches the page goes through :func:`esc` (``html.escape``
with quotes), so a log line holding ``<script>`` is shown as text.  Numbers are
written with one decimal: the page stays small with many marks.
"""

from __future__ import annotations

import html
import math
import re

from kcover.faults import Category

CATEGORY_COLOURS = {
    Category.GPU_HARDWARE: "#d62728", Category.GPU_MEMORY_OOM: "#ff7f0e",
    Category.NCCL_COMMUNICATION: "#9467bd", Category.COLLECTIVE_TIMEOUT_HANG: "#8c564b",
    Category.NETWORK_INFINIBAND: "#e377c2", Category.CUDA_SOFTWARE: "#bcbd22", Category.STORAGE_IO: "#17becf",
    Category.USER_CODE: "#1f77b4", Category.HOST_SYSTEM: "#7f7f7f", Category.INFRA_K8S: "#2ca02c",
    Category.OTHER: "#555555",
}
KIND_COLOURS = {
    "productive": "#4caf50", "startup": "#90a4ae", "restart": "#607d8b", "redone": "#ff9800",
    "detection": "#e53935", "shutdown": "#8e24aa", "backoff": "#bdbdbd", "other": "#e0e0e0",
}
OUTCOME_COLOURS = {"succeeded": "#c8e6c9", "failed": "#ffcdd2", "hung": "#ffe0b2", "interrupted": "#e1bee7",
                   "straggler": "#fff9c4"}
CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def esc(text: object, limit: int | None = None) -> str:
    """``text`` escaped for HTML text or an attribute, control characters shown as ``?``, cut at ``limit``."""
    value = str(text)
    if limit is not None and len(value) > limit:
        value = f"{value[:limit]}… ({len(value) - limit:,} more characters)"
    return html.escape(CONTROL.sub("?", value), quote=True)


def num(value: float) -> str:
    """A coordinate with at most one decimal, no trailing ``.0``."""
    text = f"{value:.1f}"
    return text[:-2] if text.endswith(".0") else text


def category_colour(category: str) -> str:
    try:
        return CATEGORY_COLOURS[Category(category)]
    except ValueError:
        return CATEGORY_COLOURS[Category.OTHER]


def duration(seconds: float) -> str:
    """``seconds`` for people: ``42.0 s``, ``12 min 5 s``, ``3 h 20 min``."""
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{int(seconds // 60)} min {int(seconds % 60)} s"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60)} min"


def ticks(span: float, count: int = 8) -> list[float]:
    """Round tick values (1, 2 or 5 × a power of ten apart) from 0 to ``span``, about ``count`` of them."""
    if span <= 0:
        return [0.0]
    raw = span / count
    magnitude = 10.0 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
    return [i * step for i in range(int(span / step + 1e-9) + 1)]


TIME_STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)
"""Seconds between time ticks, the first that gives at most about 8 ticks is used."""


def time_ticks(span: float, count: int = 8) -> list[float]:
    """Tick values from 0 to ``span`` seconds at a round time step (seconds, minutes, hours, days)."""
    if span <= 0:
        return [0.0]
    step = next((float(s) for s in TIME_STEPS if span / s <= count), None)
    if step is None:
        return [t * 86400 for t in ticks(span / 86400, count)]
    if span < count:
        return ticks(span, count)
    return [i * step for i in range(int(span // step) + 1)]


def axis(left: float, width: float, top: float, height: float, span: float, label: str) -> str:
    """Vertical grid lines and labels for a time axis of ``span`` seconds under a plot area."""
    parts = []
    values = time_ticks(span)
    step = values[1] - values[0] if len(values) > 1 else 1.0
    for value in values:
        x = left + (value / span * width if span > 0 else 0)
        parts.append(f'<line x1="{num(x)}" y1="{num(top)}" x2="{num(x)}" y2="{num(top + height)}" class="grid"/>'
                     f'<text x="{num(x)}" y="{num(top + height + 14)}" class="tick" text-anchor="middle">'
                     f'{esc(_tick_label(value, step))}</text>')
    parts.append(f'<text x="{num(left + width)}" y="{num(top + height + 28)}" class="axis-label" '
                 f'text-anchor="end">{esc(label)}</text>')
    return "".join(parts)


def _tick_label(seconds: float, step: float) -> str:
    """``seconds`` in the unit the ticks' ``step`` is a whole number of."""
    for unit, name in ((86400, "d"), (3600, "h"), (60, "min")):
        if step >= unit and step % (unit / 2) == 0:
            return f"{seconds / unit:g} {name}"
    return f"{seconds:g} s"
