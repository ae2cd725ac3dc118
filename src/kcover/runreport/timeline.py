"""The run's timeline as inline SVG: one lane per node (and per rank when few), faults as marks.

The top lane is the job: each attempt's time split by :mod:`kcover.runreport.ledger`
(productive, restart, redone, detection, shutdown, backoff) with its checkpoints
as ticks; lost time is also shaded across every lane.  Each node lane holds a
bar per attempt that ran on it, coloured by how the attempt ended.  Faults are
marks coloured by category: the root cause of a failure a large outlined
diamond, a cascade a hollow circle, any other fault a small dot.  With more
than :data:`MAX_MARKS` faults, those that are not a root cause are aggregated
per lane, category and a few pixels of time, and the page says so.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from kcover.runreport.ledger import Segment
from kcover.runreport.model import AttemptRow, FaultRow, RunData
from kcover.runreport.svg import KIND_COLOURS, OUTCOME_COLOURS, axis, category_colour, esc, num

LEFT, WIDTH, TOP = 160.0, 1000.0, 10.0
JOB_HEIGHT, NODE_HEIGHT, RANK_HEIGHT = 30.0, 24.0, 16.0
MAX_MARKS = 2000
"""Faults drawn one by one at most; beyond, the non-root ones are aggregated."""
BUCKET_PX = 4.0
MAX_NODE_LANES = 64
MAX_RANK_LANES = 16
"""Ranks get their own lanes only when there are at most this many."""
MAX_CHECKPOINT_TICKS = 300
"""Checkpoint ticks drawn at most (evenly thinned beyond: a tick per pixel would hide the job lane)."""
MAX_SEGMENTS = 1500
"""Time segments drawn one by one at most; beyond, the job lane is drawn as columns of shares."""
COLUMN_PX = 2.0
Scale = Callable[[float], float]
"""Epoch seconds to an x coordinate."""


@dataclass(frozen=True)
class Lane:
    key: tuple[str, int | None]
    """(node, rank): ``("", None)`` is the job lane, ``(node, None)`` a node lane."""
    label: str
    top: float
    height: float


@dataclass(frozen=True)
class Timeline:
    svg: str
    notes: tuple[str, ...]
    """What the page must say about the drawing (aggregated marks, lanes left out)."""
    marks: int
    """Marks drawn (after aggregation)."""
    height: float


def draw(run: RunData, segments: list[Segment], roots: set[int]) -> Timeline:
    """The timeline of ``run``; ``roots`` are the indexes (in ``run.faults``) of each failure's root cause."""
    span = max(run.ended - run.started, 1e-6)

    def x(t: float) -> float:
        return LEFT + min(max((t - run.started) / span, 0.0), 1.0) * WIDTH

    lanes, notes = _lanes(run)
    bottom = lanes[-1].top + lanes[-1].height
    parts = [_lane_backgrounds(lanes)]
    if len(segments) > MAX_SEGMENTS:
        parts.append(_dense_job_lane(segments, x, lanes[0], TOP + JOB_HEIGHT, bottom))
        notes.append(f"{len(run.attempts):,} attempts: the job lane shows, per {COLUMN_PX:g} pixels of time, the "
                     "share of each kind of time, and the shading below it the share lost")
    else:
        parts += [_shading(segments, x, TOP, bottom), _job_lane(segments, x, lanes[0])]
    ticks, tick_notes = _checkpoints(run, x, lanes[0])
    notes += tick_notes
    parts += [ticks, _attempt_bars(run, x, lanes)]
    marks, count, mark_notes = _marks(run, x, lanes, roots)
    parts.append(marks)
    parts.append(axis(LEFT, WIDTH, TOP, bottom - TOP, span, "time since the run started"))
    height = bottom + 36
    svg = (f'<svg id="timeline" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {num(LEFT + WIDTH + 20)} '
           f'{num(height)}" width="{num(LEFT + WIDTH + 20)}" height="{num(height)}" role="img" '
           f'aria-label="timeline of run {run.run_id}">{"".join(parts)}</svg>')
    return Timeline(svg, tuple(notes + mark_notes), count, height)


def _lanes(run: RunData) -> tuple[list[Lane], list[str]]:
    nodes = _node_order(run)
    notes = []
    if len(nodes) > MAX_NODE_LANES:
        busiest = Counter(f.node for f in run.faults if f.node)
        keep = set(sorted(nodes, key=lambda n: -busiest[n])[:MAX_NODE_LANES])
        notes.append(f"{len(nodes) - MAX_NODE_LANES} nodes with the fewest faults are not drawn")
        nodes = [n for n in nodes if n in keep]
    ranks = _ranks_by_node(run, nodes)
    with_ranks = sum(len(r) for r in ranks.values()) <= MAX_RANK_LANES
    lanes = [Lane(("", None), "job", TOP, JOB_HEIGHT)]
    top = TOP + JOB_HEIGHT
    for node in nodes:
        label = f"{node} (excluded)" if node in run.excluded else node
        lanes.append(Lane((node, None), label, top, NODE_HEIGHT))
        top += NODE_HEIGHT
        for rank in sorted(ranks[node]) if with_ranks else ():
            lanes.append(Lane((node, rank), f"rank {rank}", top, RANK_HEIGHT))
            top += RANK_HEIGHT
    return lanes, notes


def _node_order(run: RunData) -> list[str]:
    seen: dict[str, None] = {}
    for attempt in run.attempts:
        seen.update(dict.fromkeys(attempt.nodes))
    for node in run.excluded:
        seen.setdefault(node)
    for fault in run.faults:
        if fault.node and fault.node not in seen and "/" not in fault.node:
            seen.setdefault(fault.node)
    return list(seen)


def _ranks_by_node(run: RunData, nodes: list[str]) -> dict[str, set[int]]:
    found: dict[str, set[int]] = {node: set() for node in nodes}
    per_node = run.nproc_per_node or 0
    for attempt in run.attempts if 0 < per_node * len(nodes) <= 4 * MAX_RANK_LANES else ():
        for index, node in enumerate(attempt.nodes):
            if node in found:
                found[node].update(range(index * per_node, (index + 1) * per_node))
    for fault in run.faults:
        if fault.node in found and fault.rank is not None:
            found[fault.node].add(fault.rank)
    return found


def _lane_backgrounds(lanes: list[Lane]) -> str:
    parts = []
    for index, lane in enumerate(lanes):
        kind = "job" if lane.key == ("", None) else "node" if lane.key[1] is None else "rank"
        fill = "#fafafa" if index % 2 else "#f0f0f0"
        parts.append(f'<g class="lane lane-{kind}" data-lane="{esc(lane.label)}">'
                     f'<rect x="{num(LEFT)}" y="{num(lane.top)}" width="{num(WIDTH)}" height="{num(lane.height)}" '
                     f'fill="{fill}"/><text x="{num(LEFT - 6)}" y="{num(lane.top + lane.height / 2 + 4)}" '
                     f'class="lane-label lane-label-{kind}" text-anchor="end">{esc(lane.label, 40)}</text></g>')
    return "".join(parts)


def _shading(segments: list[Segment], x: Scale, top: float, bottom: float) -> str:
    parts = ['<g class="lost-shading">']
    for segment in segments:
        left, right = x(segment.start), x(segment.end)
        if segment.kind != "productive" and right - left >= 0.2:
            parts.append(f'<rect x="{num(left)}" y="{num(top)}" width="{num(right - left)}" '
                         f'height="{num(bottom - top)}" fill="{KIND_COLOURS[segment.kind]}" opacity=".18"/>')
    parts.append("</g>")
    return "".join(parts)


def _job_lane(segments: list[Segment], x: Scale, lane: Lane) -> str:
    parts = ['<g class="job-segments">']
    for segment in segments:
        left, right = x(segment.start), x(segment.end)
        if right - left < 0.1:
            continue
        title = f"attempt {segment.attempt}: {segment.kind} {segment.seconds:.1f} s" if segment.attempt else \
            f"{segment.kind} {segment.seconds:.1f} s"
        parts.append(f'<rect class="segment {segment.kind}" x="{num(left)}" y="{num(lane.top + 4)}" '
                     f'width="{num(right - left)}" height="{num(lane.height - 8)}" '
                     f'fill="{KIND_COLOURS[segment.kind]}"><title>{esc(title)}</title></rect>')
    parts.append("</g>")
    return "".join(parts)


def _dense_job_lane(segments: list[Segment], x: Scale, lane: Lane, top: float, bottom: float) -> str:
    """Per :data:`COLUMN_PX` of time, the share of each kind stacked in the job lane, lost share shaded below."""
    columns: list[dict[str, float]] = [defaultdict(float) for _ in range(int(WIDTH / COLUMN_PX) + 1)]
    for segment in segments:
        left, right = x(segment.start) - LEFT, x(segment.end) - LEFT
        first, last = int(left // COLUMN_PX), int(right // COLUMN_PX)
        for column in range(first, min(last, len(columns) - 1) + 1):
            low, high = max(left, column * COLUMN_PX), min(right, (column + 1) * COLUMN_PX)
            columns[column][segment.kind] += max(0.0, high - low)
    parts = ['<g class="job-segments dense">']
    for column, shares in enumerate(columns):
        total = sum(shares.values())
        if total <= 0:
            continue
        px, y = LEFT + column * COLUMN_PX, lane.top + 4
        lost = 1 - shares.get("productive", 0.0) / total
        parts.append(f'<rect x="{num(px)}" y="{num(top)}" width="{COLUMN_PX:g}" height="{num(bottom - top)}" '
                     f'fill="#9e9e9e" opacity="{lost * 0.3:.2f}"/>')
        for kind in KIND_COLOURS:
            height = shares.get(kind, 0.0) / total * (lane.height - 8)
            if height >= 0.3:
                parts.append(f'<rect class="segment {kind}" x="{num(px)}" y="{num(y)}" width="{COLUMN_PX:g}" '
                             f'height="{num(height)}" fill="{KIND_COLOURS[kind]}"/>')
                y += height
    parts.append("</g>")
    return "".join(parts)


def _checkpoints(run: RunData, x: Scale, lane: Lane) -> tuple[str, list[str]]:
    points = [(at, step, a.number) for a in run.attempts for at, step in a.checkpoints]
    stride = -(-len(points) // MAX_CHECKPOINT_TICKS) if points else 1
    parts = ['<g class="checkpoints">']
    for at, step, number in points[::stride]:
        px = x(at)
        parts.append(f'<line class="checkpoint" x1="{num(px)}" y1="{num(lane.top)}" x2="{num(px)}" '
                     f'y2="{num(lane.top + lane.height)}"><title>checkpoint at step {step} '
                     f'(attempt {number})</title></line>')
    parts.append("</g>")
    notes = [f"{len(points):,} checkpoints: every {stride}th is drawn"] if stride > 1 else []
    return "".join(parts), notes


@dataclass
class _Span:
    left: float
    right: float
    first: int
    last: int
    outcome: str


def _attempt_bars(run: RunData, x: Scale, lanes: list[Lane]) -> str:
    """A bar per attempt on each of its nodes; neighbours with the same outcome closer than a pixel are merged."""
    by_node = {lane.key[0]: lane for lane in lanes if lane.key[1] is None and lane.key[0]}
    spans: dict[str, list[_Span]] = {node: [] for node in by_node}
    for attempt in run.attempts:
        left = x(attempt.started)
        right = max(x(attempt.moments.get("stopped") or attempt.ended or run.ended), left + 0.5)
        for node in attempt.nodes:
            found = spans.get(node)
            if found is None:
                continue
            if found and found[-1].outcome == attempt.outcome and left - found[-1].right < 1.0:
                found[-1].right, found[-1].last = right, attempt.number
            else:
                found.append(_Span(left, right, attempt.number, attempt.number, attempt.outcome))
    parts = ['<g class="attempts">']
    for node, found in spans.items():
        parts += [_bar(by_node[node], span) for span in found]
    parts.append("</g>")
    return "".join(parts)


def _bar(lane: Lane, span: _Span) -> str:
    left, right, outcome = span.left, span.right, span.outcome
    name = f"#{span.first}" if span.first == span.last else f"#{span.first}–{span.last}"
    bar = (f'<rect class="attempt-bar" x="{num(left)}" y="{num(lane.top + 3)}" width="{num(right - left)}" '
           f'height="{num(lane.height - 6)}" fill="{OUTCOME_COLOURS.get(outcome, "#eeeeee")}" stroke="#666" '
           f'stroke-width=".5"><title>attempt {name[1:]} ({esc(outcome)})</title></rect>')
    if right - left > 12 + 7 * len(name):
        bar += f'<text x="{num(left + 3)}" y="{num(lane.top + lane.height / 2 + 4)}" class="bar-label">{name}</text>'
    return bar


def _marks(run: RunData, x: Scale, lanes: list[Lane], roots: set[int]) -> tuple[str, int, list[str]]:
    index = {lane.key: lane for lane in lanes}
    attempts = {a.number: a for a in run.attempts}
    placed = []
    for i, fault in enumerate(run.faults):
        attempt = attempts.get(fault.attempt)
        at = fault.at or (attempt and (attempt.moments.get("first_fault") or attempt.moments.get("stop_began")
                                       or attempt.ended)) or run.started
        placed.append((i, fault, _lane_for(fault, index, run.nproc_per_node, attempts), at))
    parts = ['<g class="faults">']
    if len(run.faults) <= MAX_MARKS:
        parts += [_mark(f, x(at), lane, i in roots, at - run.started) for i, f, lane, at in placed]
        return "".join(parts) + "</g>", len(placed), []
    parts += [_mark(f, x(at), lane, True, at - run.started) for i, f, lane, at in placed if i in roots]
    width, buckets = _buckets([(f, lane, x(at)) for i, f, lane, at in placed if i not in roots])
    for (key, category, role, column), faults in buckets.items():
        parts.append(_bucket(faults, column * width + width / 2, index[key], category, role))
    drawn = len(roots) + len(buckets)
    note = (f"{len(run.faults):,} faults: more than {MAX_MARKS:,}, so each failure's root cause is drawn on its own "
            f"and the other faults are aggregated per lane, category and {width:g} pixels of time ({drawn:,} marks; "
            "hover a mark for its count)")
    return "".join(parts) + "</g>", drawn, [note]


def _buckets(faults: list[tuple[FaultRow, Lane, float]]
             ) -> tuple[float, dict[tuple[tuple[str, int | None], str, str, int], list[FaultRow]]]:
    """The faults grouped per lane, category, role and a column of time as wide as keeps them to MAX_MARKS."""
    width = BUCKET_PX
    while True:
        buckets: dict[tuple[tuple[str, int | None], str, str, int], list[FaultRow]] = defaultdict(list)
        for fault, lane, px in faults:
            buckets[(lane.key, fault.category, fault.role, int(px // width))].append(fault)
        if len(buckets) <= MAX_MARKS or width >= WIDTH:
            return width, buckets
        width *= 2


def _lane_for(fault: FaultRow, index: dict[tuple[str, int | None], Lane], per_node: int | None,
              attempts: dict[int, AttemptRow]) -> Lane:
    node = fault.node
    if node is None and fault.rank is not None and per_node:
        attempt = attempts.get(fault.attempt)
        nodes = attempt.nodes if attempt else ()
        slot = fault.rank // per_node
        node = nodes[slot] if slot < len(nodes) else None
    if node is not None and node.endswith("/kmsg"):
        node = node.removesuffix("/kmsg")
    return index.get((node or "", fault.rank)) or index.get((node or "", None)) or index[("", None)]


def _mark(fault: FaultRow, px: float, lane: Lane, root: bool, since: float) -> str:
    colour = category_colour(fault.category)
    y = lane.top + lane.height / 2
    where = " ".join(p for p in (f"rank {fault.rank}" if fault.rank is not None else "",
                                 fault.node or "") if p)
    title = (f"{'ROOT CAUSE ' if root else ''}{fault.rule} ({fault.category}, {fault.role}) {where}, "
             f"attempt {fault.attempt}, +{since:.1f} s"
             f"{f', ×{fault.count}' if fault.count > 1 else ''}: {fault.line[:160]}")
    common = f'data-category="{esc(fault.category)}" data-rule="{esc(fault.rule)}"'
    if root:
        shape = (f'<path d="M{num(px)} {num(y - 8)}l8 8-8 8-8-8z" fill="{colour}" stroke="#000" '
                 f'stroke-width="1.5"/>')
        kind = "root"
    elif fault.role == "cascade":
        shape = f'<circle cx="{num(px)}" cy="{num(y)}" r="4" fill="#fff" stroke="{colour}" stroke-width="2"/>'
        kind = "cascade"
    else:
        shape = f'<circle cx="{num(px)}" cy="{num(y)}" r="3.5" fill="{colour}"/>'
        kind = "symptom"
    return f'<g class="fault {kind}" {common}>{shape}<title>{esc(title)}</title></g>'


def _bucket(faults: list[FaultRow], px: float, lane: Lane, category: str, role: str) -> str:
    total = sum(f.count for f in faults)
    rules = Counter(f.rule for f in faults).most_common(3)
    title = f"{len(faults):,} faults ({total:,} lines), {category}, {role}: " + ", ".join(
        f"{rule} ×{n}" for rule, n in rules)
    radius = min(3 + len(str(len(faults))), lane.height / 2 - 1)
    colour = category_colour(category)
    fill = "#fff" if role == "cascade" else colour
    return (f'<g class="fault aggregate {"cascade" if role == "cascade" else "symptom"}" '
            f'data-category="{esc(category)}" data-count="{len(faults)}"><circle cx="{num(px)}" '
            f'cy="{num(lane.top + lane.height / 2)}" r="{num(radius)}" fill="{fill}" stroke="{colour}" '
            f'stroke-width="1.5"/><title>{esc(title)}</title></g>')
