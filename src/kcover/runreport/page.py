"""The report page: one HTML document with its style inline, built from a :class:`RunData`.

Sections: the run at a glance (status, ETTR, productive and lost time, excluded
nodes), the timeline, step progress, each failure's verdict with its evidence
and remediation, where the lost time went, the ETTR trend over the database's
runs, and stragglers when a detector reported any.  A Content-Security-Policy
forbids scripts, fetches and frames, so the file is safe to open from a ticket;
every string from the history passes through :func:`~kcover.runreport.svg.esc`.
"""

from __future__ import annotations

import time
from collections import Counter

from kcover.runreport.charts import lost_bar, progress_chart, trend_chart
from kcover.runreport.ledger import KINDS, LOST, run_segments, totals
from kcover.runreport.model import AttemptRow, FaultRow, RunData
from kcover.runreport.svg import CATEGORY_COLOURS, KIND_COLOURS, OUTCOME_COLOURS, duration, esc
from kcover.runreport.timeline import Timeline, draw

MAX_FAILURES = 100
"""Failures shown in full; the rest are counted by root cause."""
MAX_EVIDENCE = 10
"""Evidence lines shown per failure."""
LINE_LIMIT = 2000
"""Characters of one evidence line shown (the rest is counted)."""
STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:24px;color:#222;max-width:1200px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd}
.cards{display:flex;gap:12px;flex-wrap:wrap;margin:12px 0}.card{border:1px solid #ddd;border-radius:6px;
padding:8px 14px;min-width:120px}.card b{display:block;font-size:22px}.muted{color:#666}
.status{padding:2px 8px;border-radius:4px;font-weight:600}.status-succeeded{background:#c8e6c9}
.status-failed,.status-lost{background:#ffcdd2}.status-interrupted{background:#e1bee7}
code,pre{font:12px/1.4 ui-monospace,monospace}pre{white-space:pre-wrap;word-break:break-all;margin:2px 0;
background:#f6f6f6;padding:4px 6px;border-radius:4px}.failure{border-left:4px solid #d62728;padding:4px 12px;
margin:12px 0}.legend span{display:inline-block;margin-right:14px}.swatch{display:inline-block;width:11px;
height:11px;margin-right:4px;vertical-align:-1px;border-radius:2px}table{border-collapse:collapse}
td,th{padding:3px 10px;text-align:left;border-bottom:1px solid #eee}.note{background:#fff8e1;padding:6px 10px;
border-radius:4px}svg text{font:11px system-ui,sans-serif;fill:#333}.grid{stroke:#ddd;stroke-width:.5}
.checkpoint{stroke:#1b5e20;stroke-width:1.5}.bar-label{fill:#333;font-size:10px}.tick{fill:#666}
"""
NOTE_HEIGHT = 60
"""Pixels a note above the timeline may take (for the PNG's window)."""
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
LIVE = ("running", "restarting")
"""Outcomes of an attempt not over yet (a Kubernetes job's current attempt)."""


def render(run: RunData, source: str, only_timeline: bool = False) -> tuple[str, float]:
    """The page for ``run`` and the timeline's height in pixels; ``source`` names where it was read from.

    ``only_timeline`` keeps the header, the figures at a glance and the timeline (the PNG's page).
    """
    segments = run_segments(run)
    spent = totals(segments)
    roots = root_indexes(run)
    timeline = draw(run, segments, roots)
    body = [_header(run), _glance(run, spent), _timeline_section(timeline)]
    if not only_timeline:
        timed = [_progress_section(run)] if run.progress_recorded else []
        body += [*timed, _failures(run, roots)]
        body += [_lost_section(spent), _trend_section(run)] if run.progress_recorded else []
        body += [_stragglers(run), f'<p class="muted">Built by kcover report from {esc(source)} at '
                 f'{esc(time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()))}.</p>']
    return _document(run, body), timeline.height + NOTE_HEIGHT * len(timeline.notes)


def _document(run: RunData, body: list[str]) -> str:
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
            f'<meta name="viewport" content="width=device-width,initial-scale=1">'
            f'<title>kcover report: {esc(_name(run))} ({esc(run.status)})</title><style>{STYLE}</style></head>'
            f'<body>{"".join(body)}</body></html>\n')


def failed_attempts(run: RunData) -> list[AttemptRow]:
    """The attempts that did not succeed, less the one still going in a run that is still running."""
    going = run.status == "running"
    return [a for a in run.attempts if a.outcome != "succeeded" and not (going and a.outcome in LIVE)]


def root_indexes(run: RunData) -> set[int]:
    """Indexes in ``run.faults`` of each failed attempt's root cause (the verdict's rule, on its nodes)."""
    wanted = {a.number: a.verdict for a in failed_attempts(run) if a.verdict.get("rule")}
    found: dict[int, int] = {}
    for index, fault in enumerate(run.faults):
        verdict = wanted.get(fault.attempt)
        if verdict is None or fault.attempt in found or fault.rule != verdict.get("rule"):
            continue
        nodes = verdict.get("nodes") or []
        if not nodes or fault.node is None or fault.node in nodes:
            found[fault.attempt] = index
    return set(found.values())


def _name(run: RunData) -> str:
    return run.title or f"run {run.run_id}"


def _header(run: RunData) -> str:
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(run.started))
    reason = f"<p>{esc(run.reason, LINE_LIMIT)}</p>" if run.reason else ""
    notes = "".join(f'<p class="note source-note">{esc(note, LINE_LIMIT)}</p>' for note in run.notes)
    return (f'<h1>kcover report: {esc(_name(run), 400)} <span class="status status-{esc(run.status)}">'
            f'{esc(run.status)}</span></h1><p class="muted">started {esc(started)} · '
            f'<code>{esc(run.command, LINE_LIMIT)}</code></p>{reason}{notes}')


def _glance(run: RunData, spent: dict[str, float]) -> str:
    wall = sum(spent.values())
    productive = spent["productive"]
    ettr = run.ettr if run.ettr is not None else (productive / wall if wall > 0 else 0.0)
    excluded = ", ".join(run.excluded) or "none"
    timed = [("ETTR", f'<b id="ettr">{ettr:.2f}</b>'), ("wall time", f"<b>{esc(duration(wall))}</b>"),
             ("productive", f'<b id="productive">{esc(duration(productive))}</b>'),
             ("lost", f'<b id="lost">{esc(duration(wall - productive))}</b>')]
    cards = [*(timed if run.progress_recorded else timed[1:2]), ("attempts", f"<b>{len(run.attempts)}</b>"),
             ("restarts", f'<b id="restarts">{run.restarts}</b>'),
             ("excluded nodes", f'<b id="excluded">{esc(excluded, 200)}</b>')]
    return '<div class="cards">' + "".join(f'<div class="card">{html}<span class="muted">{name}</span></div>'
                                           for name, html in cards) + "</div>"


def _timeline_section(timeline: Timeline) -> str:
    notes = "".join(f'<p class="note">{esc(note)}</p>' for note in timeline.notes)
    kinds = "".join(f'<span><i class="swatch" style="background:{KIND_COLOURS[k]}"></i>{k}</span>' for k in KINDS)
    categories = "".join(f'<span><i class="swatch" style="background:{c}"></i>{esc(cat.value)}</span>'
                         for cat, c in CATEGORY_COLOURS.items())
    outcomes = "".join(f'<span><i class="swatch" style="background:{c}"></i>attempt {o}</span>'
                       for o, c in OUTCOME_COLOURS.items())
    return (f'<h2>Timeline</h2>{notes}<div class="legend">{kinds}</div><div class="legend">{outcomes}'
            f'<span>◆ root cause</span><span>○ cascade</span><span>● other fault</span>'
            f'<span>| checkpoint</span></div><div class="legend">{categories}</div>{timeline.svg}')


def _progress_section(run: RunData) -> str:
    chart = progress_chart(run)
    if not chart:
        return '<h2>Step progress</h2><p class="muted">No attempt reported a training step.</p>'
    return ('<h2>Step progress</h2><p class="muted">One line per attempt, checkpoints as circles; a line that starts '
            'below the previous one is work redone after a restart.</p>' + chart)


def _failures(run: RunData, roots: set[int]) -> str:
    failed = failed_attempts(run)
    if not failed:
        return '<h2>Failures</h2><p class="muted">No attempt failed.</p>'
    by_attempt: dict[int, list[tuple[int, FaultRow]]] = {}
    for index, fault in enumerate(run.faults):
        by_attempt.setdefault(fault.attempt, []).append((index, fault))
    parts = [f"<h2>Failures ({len(failed):,})</h2>"]
    for attempt in failed[:MAX_FAILURES]:
        parts.append(_failure(attempt, by_attempt.get(attempt.number, []), roots))
    rest = failed[MAX_FAILURES:]
    if rest:
        counts = Counter(str(a.verdict.get("rule") or "no fault recognised") for a in rest)
        rows = "".join(f"<tr><td>{esc(rule, 200)}</td><td>{n:,}</td></tr>" for rule, n in counts.most_common(50))
        parts.append(f'<p class="note">{len(rest):,} more failures, by root cause:</p>'
                     f"<table><tr><th>root cause</th><th>failures</th></tr>{rows}</table>")
    return "".join(parts)


def _failure(attempt: AttemptRow, faults: list[tuple[int, FaultRow]], roots: set[int]) -> str:
    verdict = attempt.verdict
    ordered = sorted(faults, key=lambda item: (item[0] not in roots, item[1].role != "root"))
    blamed = ", ".join(str(n) for n in verdict.get("nodes") or []) or "none"
    lines = "".join(_evidence(fault, index in roots) for index, fault in ordered[:MAX_EVIDENCE])
    more = f'<p class="muted">… and {len(ordered) - MAX_EVIDENCE:,} more faults</p>' \
        if len(ordered) > MAX_EVIDENCE else ""
    remediation = verdict.get("remediation")
    fix = f"<p><b>Remediation:</b> {esc(remediation, LINE_LIMIT)}</p>" if remediation else ""
    return (f'<div class="failure" data-attempt="{attempt.number}"><h3>Attempt {attempt.number}: '
            f'{esc(attempt.outcome)} on {esc(", ".join(attempt.nodes), 400)}</h3>'
            f'<p><b>Verdict:</b> {esc(verdict.get("category") or "unrecognised")} '
            f'(<code>{esc(verdict.get("rule") or "no rule")}</code>) → {esc(verdict.get("action") or "?")}; '
            f'blamed nodes: {esc(blamed, 400)}. {esc(verdict.get("reason") or "", LINE_LIMIT)}</p>'
            f'<p><b>Decision:</b> {esc(_decision(attempt), LINE_LIMIT)}</p>'
            f'{fix}<div class="evidence">{lines or "<p class=muted>no evidence recorded</p>"}</div>{more}'
            f'{_kept(attempt)}</div>')


def _kept(attempt: AttemptRow) -> str:
    """The log lines the operator kept as evidence (Kubernetes: the evidence ConfigMap), per pod."""
    return "".join(f'<p class="muted">kept by the operator from pod <code>{esc(pod, 253)}</code>:</p>'
                   f'<pre class="kept-log">{esc(text, 20 * LINE_LIMIT)}</pre>' for pod, text in attempt.kept)


def _decision(attempt: AttemptRow) -> str:
    """``restart``, ``fail`` … and the decision's reason, without saying the decision twice."""
    decision, reason = attempt.decision or "none recorded", attempt.reason
    if not reason:
        return decision
    return reason if reason.startswith(decision) else f"{decision}: {reason}"


def _evidence(fault: FaultRow, root: bool) -> str:
    where = f"{fault.source or '?'}{f':{fault.line_number}' if fault.line_number is not None else ''}"
    tag = "root cause" if root else fault.role
    count = f" ×{fault.count}" if fault.count > 1 else ""
    return (f'<p class="muted">{esc(tag)} · {esc(fault.category)} · <code>{esc(fault.rule, 200)}</code> · '
            f'{esc(where, 400)}{count}</p><pre class="evidence-line">{esc(fault.line, LINE_LIMIT)}</pre>')


def _lost_section(spent: dict[str, float]) -> str:
    wall = sum(spent.values())
    rows = "".join(f'<tr><td><i class="swatch" style="background:{KIND_COLOURS[k]}"></i>{k}</td>'
                   f"<td>{spent[k]:.1f} s</td><td>{spent[k] / wall if wall > 0 else 0:.1%}</td></tr>"
                   for k in KINDS if spent[k] > 0)
    lost = sum(spent[k] for k in LOST)
    return (f'<h2>Where the time went</h2><p>Productive {spent["productive"]:.1f} s, lost {lost:.1f} s of '
            f'{wall:.1f} s.</p>{lost_bar(spent)}<table id="lost-table"><tr><th>kind</th><th>seconds</th>'
            f'<th>share</th></tr>{rows}</table>')


def _trend_section(run: RunData) -> str:
    chart = trend_chart(run.trend, run.run_id)
    if not chart:
        return ""
    return f"<h2>ETTR over the last {len(run.trend)} runs</h2>{chart}"


def _stragglers(run: RunData) -> str:
    if not run.stragglers:
        return ""
    rows = "".join(f"<tr><td>{s.attempt}</td><td>{'' if s.rank is None else s.rank}</td><td>{esc(s.node or '')}"
                   f"</td><td>{esc(s.detail, 400)}</td></tr>" for s in run.stragglers)
    return (f'<h2 id="stragglers">Stragglers</h2><table><tr><th>attempt</th><th>rank</th><th>node</th>'
            f"<th>detail</th></tr>{rows}</table>")
