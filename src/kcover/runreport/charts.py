"""The smaller charts of a report, as inline SVG: step progress, lost time by kind, the ETTR trend.

Step progress shares the timeline's time axis: one line per attempt, its
checkpoints as dots, so work redone after a restart shows as the step going
back.  Lines are thinned to :data:`MAX_POINTS` points in all.  The lost-time bar
splits the run's wall time by the kinds of :mod:`kcover.runreport.ledger`; the
trend shows the ETTR of the newest runs in the database, this run outlined.
"""

from __future__ import annotations

from collections.abc import Callable

from kcover.runreport.ledger import KINDS
from kcover.runreport.model import AttemptRow, RunData, TrendPoint
from kcover.runreport.svg import KIND_COLOURS, axis, esc, num, ticks

LEFT, WIDTH = 160.0, 1000.0
MAX_POINTS = 10000
MAX_CHECKPOINT_DOTS = 2000
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf")


def progress_chart(run: RunData) -> str:
    """Step over time per attempt; an empty string when no attempt reported a step."""
    attempts = [a for a in run.attempts if a.steps or a.checkpoints]
    if not attempts:
        return ""
    top, height = 10.0, 180.0
    span = max(run.ended - run.started, 1e-6)
    highest = max([s for a in attempts for _, s in (*a.steps, *a.checkpoints)] + [1])
    budget = max(2, MAX_POINTS // len(attempts))
    dots = max(1, MAX_CHECKPOINT_DOTS // len(attempts))

    def xy(at: float, step: int) -> str:
        x = LEFT + min(max((at - run.started) / span, 0.0), 1.0) * WIDTH
        return f"{num(x)},{num(top + height - step / highest * height)}"

    parts = [_step_grid(highest, top, height)]
    previous_max = 0
    for attempt in attempts:
        parts.append(_attempt_line(attempt, xy, budget, dots, previous_max))
        previous_max = max(previous_max, attempt.max_step or max((s for _, s in attempt.steps), default=0))
    parts.append(axis(LEFT, WIDTH, top, height, span, "time since the run started"))
    total = top + height + 36
    return (f'<svg id="progress" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {num(LEFT + WIDTH + 20)} '
            f'{num(total)}" width="{num(LEFT + WIDTH + 20)}" height="{num(total)}">{"".join(parts)}</svg>')


def _step_grid(highest: int, top: float, height: float) -> str:
    parts = []
    for value in (v for v in ticks(float(highest), 4) if v == int(v)):
        y = top + height - value / highest * height
        parts.append(f'<line x1="{num(LEFT)}" y1="{num(y)}" x2="{num(LEFT + WIDTH)}" y2="{num(y)}" class="grid"/>'
                     f'<text x="{num(LEFT - 6)}" y="{num(y + 4)}" class="tick" text-anchor="end">'
                     f'step {int(value):,}</text>')
    return "".join(parts)


def _attempt_line(attempt: AttemptRow, xy: Callable[[float, int], str], budget: int, dots: int,
                  previous_max: int) -> str:
    colour = PALETTE[(attempt.number - 1) % len(PALETTE)]
    steps = _thin(list(attempt.steps), budget)
    first = steps[0][1] if steps else None
    redone = f"; restarted at step {first:,}, {previous_max - first:,} steps redone" \
        if first is not None and first < previous_max else ""
    title = f"attempt {attempt.number} ({attempt.outcome}): steps {first if first is not None else '?'}–" \
            f"{attempt.max_step if attempt.max_step is not None else '?'}{redone}"
    parts = [f'<g class="progress-line" data-attempt="{attempt.number}"><title>{esc(title)}</title>']
    if steps:
        points = " ".join(xy(at, step) for at, step in steps)
        parts.append(f'<polyline points="{points}" fill="none" stroke="{colour}" stroke-width="2"/>')
    for at, step in _thin(list(attempt.checkpoints), dots):
        x, y = xy(at, step).split(",")
        parts.append(f'<circle cx="{x}" cy="{y}" r="3" fill="#fff" stroke="{colour}" stroke-width="1.5"/>')
    parts.append("</g>")
    return "".join(parts)


def _thin(points: list[tuple[float, int]], budget: int) -> list[tuple[float, int]]:
    """At most ``budget`` of ``points``, evenly spaced, the last one kept."""
    if len(points) <= budget:
        return points
    stride = len(points) / budget
    kept = [points[int(i * stride)] for i in range(budget - 1)]
    return [*kept, points[-1]]


def lost_bar(totals: dict[str, float]) -> str:
    """A stacked horizontal bar of the run's wall time by kind, with a legend."""
    wall = sum(totals.values())
    if wall <= 0:
        return ""
    parts, cursor = [], LEFT
    for kind in KINDS:
        width = totals[kind] / wall * WIDTH
        if width <= 0:
            continue
        parts.append(f'<rect class="lost-kind {kind}" x="{num(cursor)}" y="8" width="{num(width)}" height="22" '
                     f'fill="{KIND_COLOURS[kind]}"><title>{esc(kind)}: {totals[kind]:.1f} s '
                     f'({totals[kind] / wall:.0%})</title></rect>')
        cursor += width
    parts.append('<text x="154" y="24" text-anchor="end" class="lane-label">wall time</text>')
    return (f'<svg id="lost-bar" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {num(LEFT + WIDTH + 20)} 40" '
            f'width="{num(LEFT + WIDTH + 20)}" height="40">{"".join(parts)}</svg>')


def trend_chart(points: tuple[TrendPoint, ...], current: int) -> str:
    """ETTR per run (newest last), this run outlined; runs without an ETTR are drawn as gaps."""
    if not points:
        return ""
    top, height = 10.0, 120.0
    slot = min(WIDTH / max(len(points), 1), 40.0)
    parts = []
    for value in (0.0, 0.25, 0.5, 0.75, 1.0):
        y = top + height - value * height
        parts.append(f'<line x1="{num(LEFT)}" y1="{num(y)}" x2="{num(LEFT + WIDTH)}" y2="{num(y)}" class="grid"/>'
                     f'<text x="{num(LEFT - 6)}" y="{num(y + 4)}" class="tick" text-anchor="end">{value:.2f}</text>')
    for index, point in enumerate(points):
        ettr = min(max(point.ettr or 0.0, 0.0), 1.0)
        x = LEFT + index * slot + slot * 0.1
        outline = ' stroke="#000" stroke-width="2"' if point.run_id == current else ""
        label = "no ETTR" if point.ettr is None else f"ETTR {point.ettr:.2f}"
        parts.append(f'<rect class="trend-bar" x="{num(x)}" y="{num(top + height - ettr * height)}" '
                     f'width="{num(max(slot * 0.8, 0.5))}" height="{num(ettr * height)}" '
                     f'fill="{"#1f77b4" if point.status == "succeeded" else "#d62728"}"{outline}>'
                     f'<title>run {point.run_id} ({esc(point.status)}): {label}</title></rect>')
    parts.append(f'<text x="{num(LEFT + WIDTH)}" y="{num(top + height + 16)}" text-anchor="end" class="axis-label">'
                 f'runs {points[0].run_id}–{points[-1].run_id} (blue: succeeded, red: not)</text>')
    total = top + height + 24
    return (f'<svg id="trend" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {num(LEFT + WIDTH + 20)} '
            f'{num(total)}" width="{num(LEFT + WIDTH + 20)}" height="{num(total)}">{"".join(parts)}</svg>')
