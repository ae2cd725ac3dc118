"""``kcover explain``: classify logs from files, folders or stdin and print the verdict.

Human output is a short table of faults and the verdict (colour on a TTY);
``--json`` prints one JSON object (see the README).  Exit code 0 when no fatal
fault was found, 1 when one was, 2 on a usage error — an unknown option or
engine, or paths of which not one file could be read (a missing file, an empty
folder, a folder of unreadable files): a verdict over nothing would claim
"no fault" about logs never seen.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from kcover.classify.attribution import attribute
from kcover.classify.collector import FaultCollector
from kcover.classify.matcher import Matcher, default_matcher
from kcover.cli.usage import UsageError
from kcover.collect.printable import json_text, printable
from kcover.collect.sources import SourceInfo
from kcover.exit_codes import ExitCode
from kcover.explain import read_paths, scan_logs
from kcover.faults import Verdict
from kcover.report import fault_to_dict, verdict_to_dict


def explain(
    paths: Annotated[
        list[Path] | None,
        typer.Argument(help="Log files or folders of per-rank logs; stdin when none."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    catalog: Annotated[
        list[Path] | None,
        typer.Option("--catalog", help="Extra catalog file (YAML); may be repeated."),
    ] = None,
    engine: Annotated[
        str, typer.Option(help="Scanning engine: auto, hyperscan or re.")
    ] = "auto",
) -> None:
    """Explain why a training job failed: root cause, blamed nodes, what to do."""
    if engine not in ("auto", "hyperscan", "re"):
        raise UsageError(f"--engine must be auto, hyperscan or re (got {engine!r})")
    matcher = default_matcher(tuple(str(p) for p in catalog or ()), engine)
    verdict = _explain_files(paths, matcher) if paths else _explain_stdin(matcher)
    if as_json:
        typer.echo(json_text(explain_document(verdict, matcher.engine.name)))
    else:
        from kcover.cli.render import print_verdict  # rich, only for the table: --json starts faster

        print_verdict(verdict)
    raise typer.Exit(ExitCode.FAILED if verdict.root and verdict.root.is_fatal else ExitCode.SUCCESS)


def _explain_files(paths: list[Path], matcher: Matcher) -> Verdict:
    """The verdict over these files and folders; a usage error when not one file could be read."""
    verdict, read = read_paths(paths, matcher=matcher)
    if read == 0 and len(verdict.warnings) == 1:  # one line says it all
        raise UsageError(f"nothing was read: {verdict.warnings[0].removesuffix(', skipped')}")
    for warning in verdict.warnings:
        typer.echo(f"kcover: warning: {warning}", err=True)
    if read == 0:
        raise UsageError(f"nothing was read: {_nothing_read(paths, len(verdict.warnings))}")
    return verdict


def _explain_stdin(matcher: Matcher) -> Verdict:
    """The verdict over what is piped in; a usage error when stdin is closed or cannot be read."""
    if sys.stdin is None:  # started with `<&-`
        raise UsageError("nothing was read: stdin is closed (give log files or folders, or pipe logs in)")
    collector = FaultCollector()
    warnings: list[str] = []
    try:
        read, _ = scan_logs(matcher, sys.stdin.buffer, SourceInfo(name="<stdin>"), collector, warnings, seekable=False)
    except OSError as error:
        raise UsageError(f"cannot read stdin: {error.strerror or error}") from None
    if read == 0 and len(warnings) < 2:  # an archive with no log in it, or a packing named in the one warning
        why = warnings[0].removesuffix(", skipped") if warnings else "<stdin>: an archive with no file in it"
        raise UsageError(f"nothing was read: {why}")
    for warning in warnings:
        typer.echo(f"kcover: warning: {warning}", err=True)
    if read == 0:
        raise UsageError(f"nothing was read: no log on stdin could be read ({len(warnings)} problems, named above)")
    return attribute(collector.faults, warnings, collector.tails, collector.progress)


def _nothing_read(paths: list[Path], skipped: int) -> str:
    given = ", ".join(printable(str(path)) for path in paths)
    if not skipped:
        return f"no log file in {given}"
    return f"no log in {given} could be read ({skipped} problems, each named above)"


def explain_document(verdict: Verdict, engine: str) -> dict[str, object]:
    """The ``--json`` document of ``kcover explain``."""
    return {
        "verdict": verdict_to_dict(verdict),
        "faults": [fault_to_dict(fault) for fault in verdict.faults],
        "warnings": list(verdict.warnings),
        "engine": engine,
    }
