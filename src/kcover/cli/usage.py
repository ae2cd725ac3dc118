"""Usage errors of every kcover command, and the checks of numeric option values.

A usage error is the user's mistake: a bad option or value, a file that is not
there.  It is one line on stderr, ``kcover: <what is wrong>``, exit code 2,
nothing started.  With ``--json`` stdout also carries exactly one object,
``{"status": "usage_error", "error": "<the same line>"}`` (``status`` as in the
document of ``kcover run --json``), so a script that parses stdout always
gets JSON.

Commands raise :class:`UsageError` with a message that names the option (or
file), the bad value and what is allowed.  The option callbacks below
(:func:`seconds`, :func:`whole_number`, :func:`port`) refuse values a parser
accepts but a command cannot honour: ``nan``, ``inf``, zero or negative
durations, counts beyond what one machine can do.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable

import typer
from typer._click import exceptions as click_errors  # Typer's own copy of click

MAX_SECONDS = 30 * 86400  # the longest duration any option takes: 30 days
MAX_COUNT = 1_000_000


ClickException = click_errors.ClickException
ClickUsageError = click_errors.UsageError
NoArgsIsHelpError = click_errors.NoArgsIsHelpError
Abort = typer.Abort


class UsageError(click_errors.UsageError):
    """A user mistake with a complete one-line message (no "see --help" hint is added)."""


def one_line(message: str) -> str:
    """The message on one line: kcover's errors are one line each."""
    return " ".join(message.split())


def wants_json(argv: list[str]) -> bool:
    """Did the user ask for ``--json``? (Only options before ``--`` count: the rest is a training command.)"""
    options = argv[: argv.index("--")] if "--" in argv else argv
    return "--json" in options


def error_document(message: str) -> str:
    """The one JSON object printed on stdout for a usage error under ``--json``."""
    return json.dumps({"status": "usage_error", "error": message}, indent=2)


def _name(param: typer.CallbackParam) -> str:
    return max(param.opts, key=len) if param.opts else str(param.name)


def shown(value: float) -> str:
    """A number as the user would have typed it (``30``, ``0.5``, ``nan``)."""
    return f"{value:g}" if isinstance(value, float) else str(value)


def seconds(*, least: float = 0.0, zero: str | None = None
            ) -> Callable[[typer.Context, typer.CallbackParam, float | None], float | None]:
    """An option callback for a duration: finite, above 0 (or from ``least``; or 0 when ``zero`` says what 0 means)."""

    def check(ctx: typer.Context, param: typer.CallbackParam, value: float | None) -> float | None:
        if value is None:
            return None
        low_ok = value >= least if least else (value >= 0 if zero else value > 0)
        if not (math.isfinite(value) and low_ok and value <= MAX_SECONDS):
            low = f"from {least:g}" if least else (f"from 0 ({zero})" if zero else "greater than 0")
            raise UsageError(f"{_name(param)} must be a number of seconds {low} and at most {MAX_SECONDS} (30 days) "
                             f"(got {shown(value)})")
        return value

    return check


def whole_number(low: int, high: int = MAX_COUNT, *, also: int | None = None, meaning: str = ""
                 ) -> Callable[[typer.Context, typer.CallbackParam, int | None], int | None]:
    """An option callback for a count from ``low`` to ``high`` (and ``also``, a special value, e.g. 0 = off)."""

    def check(ctx: typer.Context, param: typer.CallbackParam, value: int | None) -> int | None:
        if value is None or low <= value <= high or value == also:
            return value
        special = f"{also} ({meaning}) or " if also is not None else ""
        raise UsageError(f"{_name(param)} must be {special}a whole number from {low} to {high} (got {value})")

    return check


def port() -> Callable[[typer.Context, typer.CallbackParam, int | None], int | None]:
    """An option callback for a TCP port: 1 to 65535 (or absent)."""
    return whole_number(1, 65535)
