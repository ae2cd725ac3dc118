"""``kcover report`` at scale: size and build time of a run with 1,000 attempts and 100,000 faults.

A synthetic history (8 nodes × 8 ranks, every attempt failing on a fault with
100 cascading faults, 2,000 steps and 10 checkpoints per attempt, one 1 MiB
evidence line) is written to a real ``kcover.db``; the report is built from it
as ``kcover report`` does.  The baseline, measured in the same run, is the time
to just read the run's rows from the database.  With Chromium on PATH, the time
to open the page (load, lay out, dump the DOM) is measured against a blank page.
Targets: under 5 MB, opens in under 2 s.

    python -m bench.report_size [--attempts 1000] [--faults 100000] [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import subprocess
import tempfile
import time
from pathlib import Path

from bench.args import existing_dir
from kcover.launcher.history import History
from kcover.runreport.build import build_report
from kcover.runreport.output import browser_command, find_browser

CATEGORIES = ("gpu_hardware", "nccl_communication", "collective_timeout_hang", "user_code", "storage_io")


def synthetic_history(database: Path, attempts: int, faults: int, nodes: int = 8, per_node: int = 8,
                      samples: int = 2000) -> None:
    """A run of ``attempts`` failed-and-restarted attempts holding ``faults`` faults in all, in ``database``."""
    History(database).close()  # the real schema
    db = sqlite3.connect(database)
    start, length = 1_700_000_000.0, 60.0
    names = [f"node-{i}" for i in range(nodes)]
    db.execute("INSERT INTO runs (id, started, ended, status, command, restarts, ettr, reason, run_dir, "
               "nproc_per_node, excluded) VALUES (1, ?, ?, 'failed', ?, ?, 0.5, 'budget spent', NULL, ?, ?)",
               (start, start + attempts * length, json.dumps(["python", "train.py"]), attempts - 1, per_node,
                json.dumps(names[:1])))
    per_attempt = max(1, faults // max(attempts, 1))
    attempt_rows, fault_rows, progress_rows = [], [], []
    for number in range(1, attempts + 1):
        began = start + (number - 1) * length
        moments = {"launched": began + 1, "first_progress": began + 5, "last_checkpoint": began + 40,
                   "first_fault": began + 45, "stop_began": began + 50, "stopped": began + 52,
                   "max_step": 2000 * number,
                   "productive_seconds": 35.0}
        verdict = {"category": "gpu_hardware", "rule": "xid.79.fallen-off-bus", "action": "restart_excluding_nodes",
                   "nodes": [names[number % nodes]], "ranks": [], "reason": "GPU has fallen off the bus",
                   "remediation": "Drain the node."}
        attempt_rows.append((1, number, began, began + length, json.dumps(names), "failed", json.dumps(verdict),
                             "restart", "restart after Xid 79", json.dumps(moments)))
        for index in range(per_attempt):
            root = index == 0
            fault_rows.append((1, number, "xid.79.fallen-off-bus" if root else f"cascade.rule.{index % 7}",
                               "gpu_hardware" if root else CATEGORIES[index % len(CATEGORIES)], "fatal",
                               "root" if root else "cascade", None if root else index % (nodes * per_node),
                               names[number % nodes], 1, "rank0", index, "NVRM: Xid 79 " + "x" * 80,
                               began + 45 + index * 0.05))
        progress_rows += [(1, number, began + 5 + i * 35 / samples, 2000 * (number - 1) + i * 2000 // samples, 0)
                          for i in range(samples)]
        progress_rows += [(1, number, began + 5 + i * 3.5, 2000 * (number - 1) + i * 200, 1) for i in range(10)]
    fault_rows[1] = (*fault_rows[1][:11], "y" * (1 << 20), fault_rows[1][12])
    db.executemany("INSERT INTO attempts (run_id, number, started, ended, nodes, outcome, verdict, decision, reason, "
                   "timings) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", attempt_rows)
    db.executemany("INSERT INTO faults (run_id, attempt, rule, category, severity, role, rank, node, count, source, "
                   "line_number, line, at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", fault_rows)
    db.executemany("INSERT INTO progress VALUES (?, ?, ?, ?, ?)", progress_rows)
    db.commit()
    db.close()


def read_rows(database: Path) -> float:
    """Seconds to just read the run's rows (the baseline)."""
    began = time.perf_counter()
    db = sqlite3.connect(database)
    for table in ("runs", "attempts", "faults", "progress"):
        db.execute(f"SELECT * FROM {table}").fetchall()
    db.close()
    return time.perf_counter() - began


def open_seconds(page: Path, scratch: Path) -> float | None:
    """Seconds for headless Chromium to load ``page`` and dump its DOM (None without Chromium)."""
    browser = find_browser()
    if browser is None:
        return None
    command = [*browser_command(browser, str(scratch / "profile")), "--dump-dom", page.as_uri()]
    began = time.perf_counter()
    subprocess.run(command, capture_output=True, timeout=120, check=True)
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--attempts", type=int, default=1000)
    parser.add_argument("--faults", type=int, default=100_000)
    parser.add_argument("--dir", type=existing_dir, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as scratch:
        folder = Path(scratch)
        database = folder / "kcover.db"
        synthetic_history(database, args.attempts, args.faults)
        baseline = read_rows(database)
        began = time.perf_counter()
        report = build_report(database, 1, folder / "report.html")[0]
        build = time.perf_counter() - began
        size = report.stat().st_size
        print(f"{args.attempts:,} attempts, {args.faults:,} faults: report {size / 1e6:.2f} MB (target < 5 MB)")
        print(f"build {build:.2f} s; baseline (read the rows) {baseline:.2f} s; ratio {build / baseline:.1f}x")
        blank = folder / "blank.html"
        blank.write_text("<!DOCTYPE html><title>blank</title>")
        opened, empty = open_seconds(report, folder), open_seconds(blank, folder)
        if opened is None or empty is None:
            print("open: no Chromium on PATH, not measured")
        else:
            print(f"open in headless Chromium {opened:.2f} s (blank page {empty:.2f} s; the page's own "
                  f"{opened - empty:.2f} s, target < 2 s)")


if __name__ == "__main__":
    main()
