"""Write a report where it was asked for, atomically, and optionally a PNG of its timeline.

The HTML goes to a temporary file in the target folder and is renamed over the
target, so a failure (full disk, a signal) never leaves a half-written report.
The PNG is a screenshot by headless Chromium (the lightest renderer an agent
image is likely to have; nothing is installed for it): a page holding only the
header and the timeline is rendered to ``<report>.png``.  A missing Chromium or
a failed screenshot is a :class:`ReportError` naming what is missing.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from kcover.exit_codes import ExitCode

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
SCREENSHOT_TIMEOUT = 60.0
"""Seconds Chromium may take to render the PNG."""


class ReportError(Exception):
    """The report cannot be written (or its PNG made); the message says why in one line.

    ``code`` is kcover's exit code for it: a usage error (2) for what the user named wrong — a folder as the
    target, a folder that does not exist or cannot be written, an unknown run — else failed (1).
    """

    def __init__(self, message: str, code: ExitCode = ExitCode.FAILED) -> None:
        super().__init__(message)
        self.code = code


def check_target(path: Path) -> None:
    """Refuse a target that is a folder or lies in a folder that does not exist, before any work."""
    if path.is_dir():
        raise ReportError(f"{path} is a folder; name a file for the report, e.g. {path / 'report.html'}",
                          ExitCode.USAGE)
    folder = path.parent
    if not folder.is_dir():
        raise ReportError(f"cannot write the report to {path}: folder {folder} does not exist", ExitCode.USAGE)
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ReportError(f"cannot write the report to {path}: folder {folder} is not writable", ExitCode.USAGE)
    if path.exists() and not path.is_file():
        raise ReportError(f"cannot write the report to {path}: it is not a regular file", ExitCode.USAGE)


def write_atomically(path: Path, text: str) -> None:
    """``text`` (UTF-8, unpaired surrogates replaced) to ``path`` through a temporary file and a rename."""
    check_target(path)
    data = text.encode("utf-8", errors="replace")
    try:
        handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise ReportError(f"cannot write the report to {path}: {_why(exc)}") from None
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise ReportError(f"cannot write the report to {path}: {_why(exc)}") from None


def _why(exc: OSError) -> str:
    """Why a write failed; a full disk in kcover's own words (a run says the OS's words about it only once)."""
    return "the disk is full" if exc.errno == errno.ENOSPC else str(exc.strerror or exc)


def find_browser() -> str | None:
    """The first headless-capable Chromium on PATH (``KCOVER_CHROMIUM`` names one explicitly)."""
    named = os.environ.get("KCOVER_CHROMIUM")
    if named:
        return shutil.which(named)
    return next((found for name in BROWSERS if (found := shutil.which(name))), None)


def browser_command(browser: str, profile: str) -> list[str]:
    """Chromium run headless, offline, in a throw-away profile (no sandbox as root, where it cannot start)."""
    command = [browser, "--headless", "--disable-gpu", "--no-first-run", "--no-default-browser-check",
               "--disable-extensions", "--disable-background-networking", "--hide-scrollbars",
               f"--user-data-dir={profile}"]
    if os.geteuid() == 0:
        command.append("--no-sandbox")
    return command


def write_png(page: str, target: Path, width: int, height: int) -> None:
    """Render ``page`` (a whole HTML document) with headless Chromium into ``target``."""
    browser = find_browser()
    if browser is None:
        raise ReportError("--png needs Chromium and none was found on PATH (looked for "
                          f"{', '.join(BROWSERS)}; on Debian: apt-get install chromium)")
    with tempfile.TemporaryDirectory(prefix="kcover-png-") as scratch:
        html = Path(scratch) / "timeline.html"
        html.write_text(page, encoding="utf-8", errors="replace")
        shot = Path(scratch) / "timeline.png"
        command = [*browser_command(browser, str(Path(scratch) / "profile")), f"--screenshot={shot}",
                   f"--window-size={width},{height}", html.as_uri()]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=SCREENSHOT_TIMEOUT, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ReportError(f"--png: {browser} did not render the timeline: {exc}") from None
        if not shot.is_file():
            detail = _last_line(done.stderr) or f"exit status {done.returncode}"
            raise ReportError(f"--png: {browser} did not render the timeline ({detail})")
        try:
            shutil.copyfile(shot, target.with_name(f".{target.name}.tmp"))
            os.replace(target.with_name(f".{target.name}.tmp"), target)
        except OSError as exc:
            raise ReportError(f"cannot write {target}: {exc.strerror or exc}") from None


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return re.sub(r"\s+", " ", lines[-1])[:300] if lines else ""
