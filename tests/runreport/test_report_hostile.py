"""Reports of hostile histories: markup in logs, no attempts, impossible times, a 1 MiB evidence line, old schemas.

The databases are real SQLite files written with the history's own schema (and
raw SQL for values kcover itself would never write).  Every page must build,
show the hostile text as text — never as markup — and stay small.
"""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

import pytest
from tests.runreport.conftest import dump_dom, kcover

from kcover.launcher.history import History

HOSTILE = "<script>alert('x')</script><img src=x onerror=alert(1)>&amp;\x00\x1b[31m"
START = 1_700_000_000.0


def database(folder: Path, attempts: list[dict[str, object]], faults: list[dict[str, object]],
             run: dict[str, object] | None = None) -> Path:
    path = folder / "kcover.db"
    History(path).close()
    db = sqlite3.connect(path)
    values = {"id": 1, "started": START, "ended": START + 100, "status": "failed", "command": json.dumps([HOSTILE]),
              "restarts": 0, "ettr": 0.5, "reason": HOSTILE, "excluded": json.dumps([HOSTILE]), **(run or {})}
    db.execute(f"INSERT INTO runs ({', '.join(values)}) VALUES ({', '.join('?' * len(values))})", list(values.values()))
    for attempt in attempts:
        row = {"run_id": 1, "number": 1, "started": START, "ended": START + 50, "nodes": json.dumps(["node-0"]),
               "outcome": "failed", "verdict": json.dumps({"rule": "xid.79.fallen-off-bus", "category": "gpu_hardware",
                                                           "reason": HOSTILE, "remediation": HOSTILE}),
               "decision": "fail", "reason": HOSTILE, **attempt}
        db.execute(f"INSERT INTO attempts ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})", list(row.values()))
    for fault in faults:
        row = {"run_id": 1, "attempt": 1, "rule": "xid.79.fallen-off-bus", "category": "gpu_hardware",
               "severity": "fatal", "role": "root", "rank": 0, "node": "node-0", "count": 1, "source": HOSTILE,
               "line_number": 3, "line": HOSTILE, "at": START + 10, **fault}
        db.execute(f"INSERT INTO faults ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})", list(row.values()))
    db.commit()
    db.close()
    return path


def report(folder: Path) -> str:
    done = kcover("report", "--state-dir", str(folder), "-o", str(folder / "r.html"))
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    return (folder / "r.html").read_text()


def no_markup_from_logs(page: str) -> None:
    assert "<script" not in page.lower()
    assert "<img" not in page.lower()
    assert "onerror=alert" not in page.replace("onerror=alert(1)&gt;", "")  # only as escaped text
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in page
    assert "\x00" not in page and "\x1b" not in page


def test_markup_in_every_field_is_text(tmp_path: Path) -> None:
    database(tmp_path, [{"nodes": json.dumps([HOSTILE, "node-1"])}],
             [{"node": HOSTILE, "rule": HOSTILE, "category": HOSTILE, "role": HOSTILE}, {}])
    no_markup_from_logs(report(tmp_path))


def test_markup_renders_as_text_in_chromium(tmp_path: Path, chromium: str, profile: str) -> None:
    database(tmp_path, [{}], [{}])
    page = report(tmp_path)
    no_markup_from_logs(page)
    dom = dump_dom(chromium, profile, tmp_path / "r.html")
    assert "<script" not in dom.lower() and "<img" not in dom.lower()
    assert "&lt;script&gt;alert('x')&lt;/script&gt;" in dom  # shown to the reader as the text it was


def test_a_run_with_no_attempts(tmp_path: Path) -> None:
    database(tmp_path, [], [], {"ended": None, "status": "lost", "ettr": None})
    page = report(tmp_path)
    assert 'id="timeline"' in page and 'id="ettr">0.00<' in page
    assert "No attempt failed." in page and "No attempt reported a training step." in page


@pytest.mark.parametrize("moment", [float("inf"), float("-inf"), -5e9, -1.0, 0.0, 1e300])
def test_impossible_times_build_a_page_with_no_negative_width(tmp_path: Path, moment: float) -> None:
    timings = {"launched": moment, "first_progress": START + 60, "last_checkpoint": START - 10,
               "first_fault": moment, "stop_began": START + 5, "stopped": START - 100, "max_step": -3}
    raw = json.dumps(timings)  # Infinity, NaN: what a damaged row could hold
    database(tmp_path, [{"timings": raw, "ended": START - 30}, {"number": 2, "started": moment, "ended": None}],
             [{"at": moment}, {"at": None, "attempt": 2}], {"ended": START - 50, "ettr": -2.0})
    with sqlite3.connect(tmp_path / "kcover.db") as db:
        db.execute("INSERT INTO progress VALUES (1, 1, ?, 5, 0), (1, 1, ?, -7, 1)", (moment, START + 1))
    page = report(tmp_path)
    assert not re.search(r'(width|height)="-', page)
    assert "nan" not in re.sub(r"[a-z]nan|nan[a-z]", "", page.lower()).replace("remediation", "")


def test_nan_durations_in_the_timings(tmp_path: Path) -> None:
    raw = '{"launched": NaN, "first_progress": NaN, "stopped": NaN, "productive_seconds": NaN}'
    database(tmp_path, [{"timings": raw}, {"number": 2, "timings": "{not json", "verdict": "[1, 2]",
                                           "nodes": "7"}], [])
    page = report(tmp_path)
    assert "NaN" not in page and not re.search(r'="nan"', page)


def test_a_one_mib_evidence_line_is_cut_and_counted(tmp_path: Path) -> None:
    line = "E" * (1 << 20) + "<script>tail</script>"
    database(tmp_path, [{}], [{"line": line}, {"line": line, "role": "cascade", "rule": "nccl.x"}])
    page = report(tmp_path)
    assert len(page) < 200_000
    assert "more characters)" in page
    assert "tail" not in page


def test_an_old_database_without_the_report_columns(tmp_path: Path) -> None:
    path = tmp_path / "kcover.db"
    with sqlite3.connect(path) as db:
        db.executescript("""
            CREATE TABLE runs (id INTEGER PRIMARY KEY, started REAL NOT NULL, ended REAL, status TEXT NOT NULL,
                command TEXT NOT NULL, restarts INTEGER NOT NULL DEFAULT 0, ettr REAL, root_category TEXT,
                root_rule TEXT, reason TEXT);
            CREATE TABLE attempts (run_id INTEGER NOT NULL, number INTEGER NOT NULL, started REAL NOT NULL,
                ended REAL, nodes TEXT NOT NULL, outcome TEXT, verdict TEXT, decision TEXT, reason TEXT);
            INSERT INTO runs VALUES (1, 1700000000, 1700000100, 'succeeded', '["old"]', 0, 0.9, NULL, NULL, '');
            INSERT INTO attempts VALUES (1, 1, 1700000000, 1700000100, '["node-0"]', 'succeeded', '{}', 'done', '');
        """)
    before = path.read_bytes()
    page = report(tmp_path)
    assert 'id="ettr">0.90<' in page and 'data-lane="node-0"' in page
    assert path.read_bytes() == before  # read only


def test_stragglers_show_only_when_reported(tmp_path: Path) -> None:
    database(tmp_path, [{}], [])
    assert 'id="stragglers"' not in report(tmp_path)
    with sqlite3.connect(tmp_path / "kcover.db") as db:
        db.execute("DROP TABLE IF EXISTS stragglers")  # the fewest columns a reader must cope with
        db.execute("CREATE TABLE stragglers (run_id INTEGER, attempt INTEGER, rank INTEGER, node TEXT, detail TEXT)")
        db.execute("INSERT INTO stragglers VALUES (1, 1, 3, 'node-0', ?)", (HOSTILE,))
    page = report(tmp_path)
    assert 'id="stragglers"' in page
    no_markup_from_logs(page)
