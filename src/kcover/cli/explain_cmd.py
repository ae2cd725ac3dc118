"""``kcover explain``: classify logs from files, folders or stdin and print the verdict.

Human output is a short table of faults and the verdict (colour on a TTY);
``--json`` prints one JSON object (see the README).  Exit code 0 when no fatal
fault was found, 1 when one was, 2 on a usage error.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from kcover.classify.attribution import attribute
from kcover.classify.collector import FaultCollector, SourceInfo
from kcover.cli.render import print_verdict
from kcover.explain import default_matcher, explain_paths, scan_stream
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
        raise typer.BadParameter(
            f"unknown engine {engine!r}; choose auto, hyperscan or re", param_hint="--engine"
        )
    matcher = default_matcher(tuple(str(p) for p in catalog or ()), engine)
    if paths:
        missing = [p for p in paths if not p.exists()]
        if len(missing) == len(paths):
            typer.echo(f"kcover: no such file or folder: {', '.join(map(str, missing))}", err=True)
            raise typer.Exit(2)
        verdict = explain_paths(paths, matcher=matcher)
    else:
        collector = FaultCollector()
        scan_stream(matcher, sys.stdin.buffer, SourceInfo(name="<stdin>"), collector)
        verdict = attribute(collector.faults)
    for warning in verdict.warnings:
        typer.echo(f"kcover: warning: {warning}", err=True)
    if as_json:
        typer.echo(json.dumps(explain_document(verdict, matcher.engine.name), indent=2))
    else:
        print_verdict(verdict)
    raise typer.Exit(1 if verdict.root and verdict.root.is_fatal else 0)


def explain_document(verdict: Verdict, engine: str) -> dict[str, object]:
    """The ``--json`` document of ``kcover explain``."""
    return {
        "verdict": verdict_to_dict(verdict),
        "faults": [fault_to_dict(fault) for fault in verdict.faults],
        "warnings": list(verdict.warnings),
        "engine": engine,
    }
