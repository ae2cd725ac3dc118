"""Build a run's report: read the history, render the page, write it (and a PNG on request).

:func:`build_report` is what ``kcover report`` calls; :func:`report_after_run`
is what ``kcover run`` and ``kcover demo`` call at their end, best effort: it
never raises, so a report that cannot be built never changes a run's outcome.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from kcover.exit_codes import ExitCode
from kcover.launcher.history import HistoryError
from kcover.runreport.load import UnknownRunError, load_run
from kcover.runreport.model import RunData
from kcover.runreport.output import ReportError, check_target, write_atomically, write_png
from kcover.runreport.page import render

REPORT_NAME = "report.html"
PNG_WIDTH = 1220
PNG_CHROME = 370
"""Pixels above the timeline in the PNG's page (header, figures, legend)."""


def build_report(database: Path, run_id: int | None, target: Path | None, png: bool = False) -> list[Path]:
    """Write the report of ``run_id`` (newest when ``None``) to ``target`` (default: in the run's folder).

    Returns the files written (the HTML, then the PNG).  Raises :class:`ReportError` (with one line to show)
    for a missing or unusable database, an unknown run, or a target that cannot be written.
    """
    if target is not None:
        check_target(target)
    try:
        run = load_run(database, run_id)
    except UnknownRunError as exc:
        raise ReportError(str(exc), ExitCode.USAGE) from None
    except HistoryError as exc:
        raise ReportError(str(exc)) from None
    except sqlite3.Error as exc:
        raise ReportError(f"cannot read state database {database}: {exc}") from None
    target = target or default_target(database, run.run_dir, run.run_id)
    return write_report(run, str(database), target, png)


def write_report(run: RunData, source: str, target: Path, png: bool = False) -> list[Path]:
    """Render ``run`` (read from ``source``) into ``target`` and, with ``png``, its timeline next to it."""
    page, _ = render(run, source)
    write_atomically(target, page)
    written = [target]
    if png:
        timeline, height = render(run, source, only_timeline=True)
        picture = target.with_suffix(".png")
        try:
            write_png(timeline, picture, PNG_WIDTH, int(height + PNG_CHROME))
        except ReportError as exc:
            raise ReportError(f"{exc}; the HTML report was written to {target}", exc.code) from None
        written.append(picture)
    return written


def default_target(database: Path, run_dir: str | None, run_id: int) -> Path:
    """``report.html`` in the run's folder (found by its name under the state dir, which may have moved), else
    ``kcover-report-<run>.html`` in the current folder."""
    if run_dir:
        folder = database.parent / "runs" / Path(run_dir).name
        if folder.is_dir():
            return folder / REPORT_NAME
    return Path(f"kcover-report-{run_id}.html")


def report_after_run(state_dir: Path, run_dir: str) -> tuple[Path | None, str]:
    """The newest run's report in ``run_dir`` (the run that just ended); (path, "") or (None, why not)."""
    try:
        run = load_run(state_dir / "kcover.db", None)
        if run.run_dir is None or Path(run.run_dir).name != Path(run_dir).name:  # <UTC time>-<pid>: ASCII
            return None, "the run was not recorded in the history"
        target = Path(run_dir) / REPORT_NAME
        write_atomically(target, render(run, str(state_dir / "kcover.db"))[0])
    except Exception as exc:  # a report is a courtesy: it never changes how the run ended
        return None, f"{type(exc).__name__}: {exc}"
    return target, ""
