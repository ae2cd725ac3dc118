"""``kcover run``: supervise a distributed training command and recover it by itself.

Worker output goes to per-rank logs under the state dir and (unless ``--quiet``)
to stderr prefixed ``[rankN]:``; kcover's own events go to stderr; with
``--json`` stdout carries exactly one JSON object at exit.  Exit code 0 only
when the job finally succeeded; 1 when it failed; 130 when interrupted; 2 on a
usage error (nothing started).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from kcover.cli.report_cmd import announce_report
from kcover.cli.usage import UsageError
from kcover.collect.printable import json_text
from kcover.decide.policy import RecoveryPolicy
from kcover.decide.straggler_action import StragglerAction
from kcover.exit_codes import ExitCode
from kcover.launcher import statedir
from kcover.launcher.inject import InjectError, parse_injections
from kcover.launcher.reporting import print_summary, run_document
from kcover.launcher.spec import RunSpec, SpecError, validate
from kcover.launcher.supervisor import Supervisor
from kcover.launcher.workers import LaunchError


def run(
    command: Annotated[list[str], typer.Argument(help="The training command, after `--`.")],
    nproc_per_node: Annotated[int, typer.Option(help="Worker processes per node.")] = 1,
    nnodes: Annotated[int, typer.Option(help="Nodes to simulate on this machine (named node-0 …).")] = 1,
    spare_nodes: Annotated[int, typer.Option(help="Standby nodes that replace an excluded one.")] = 0,
    min_nodes: Annotated[int | None, typer.Option(help="Allow shrinking to this many nodes when none is spare.")]
    = None,
    max_restarts: Annotated[int, typer.Option(help="Retry budget.")] = 3,
    user_code_retries: Annotated[int, typer.Option(help="Retries for deterministic user errors.")] = 1,
    backoff: Annotated[float, typer.Option(help="Backoff before the 2nd restart (doubles, max 60 s).")] = 1.0,
    state_dir: Annotated[Path, typer.Option(help="Logs, evidence and the run database.")] = Path(".kcover"),
    hang_timeout: Annotated[float | None, typer.Option(help="Seconds without progress = hung (default: learned).")]
    = None,
    startup_timeout: Annotated[float, typer.Option(help="Seconds allowed before the first step.")] = 900.0,
    grace_period: Annotated[float, typer.Option(help="Seconds between SIGTERM and SIGKILL.")] = 10.0,
    inject: Annotated[list[str] | None,
                      typer.Option(help="Fault to inject, KIND@TARGET[:step=N|:after=S][:factor=F].")] = None,
    straggler_action: Annotated[str, typer.Option(help="On a straggler: report, or replace its node when a spare "
                                                       "exists and the gain beats the restart cost.")] = "report",
    total_steps: Annotated[int | None, typer.Option(help="The job's total steps (weighs --straggler-action "
                                                         "replace).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout at exit.")] = False,
    quiet: Annotated[bool, typer.Option(help="Do not echo worker output to stderr.")] = False,
    preflight: Annotated[bool, typer.Option(help="Run the quick health suite first; refuse to start on failure.")]
    = False,
    health_config: Annotated[Path | None, typer.Option(help="Thresholds for --preflight (merged over defaults).")]
    = None,
) -> None:
    """Run a training command as N×P workers and recover it from faults by itself."""
    try:
        injections = parse_injections(",".join([os.environ.get("KCOVER_INJECT", ""), *(inject or [])]))
        spec = RunSpec(
            command=tuple(command), nproc_per_node=nproc_per_node, nnodes=nnodes, spare_nodes=spare_nodes,
            state_dir=state_dir,
            policy=RecoveryPolicy(max_restarts=max_restarts, user_code_retries=user_code_retries,
                                  backoff_initial=backoff, min_nodes=min_nodes),
            hang_timeout=hang_timeout, startup_timeout=startup_timeout, grace_period=grace_period,
            injections=tuple(injections), echo=not quiet,
            straggler_action=_straggler_action(straggler_action), total_steps=total_steps,
        )
        validate(spec)  # command, state dir and values first: a usage error starts nothing, not even --preflight
        if preflight:
            statedir.ensure_free(state_dir)  # never check storage inside a state dir a live run holds
            _preflight(state_dir, nnodes, health_config)
        supervisor = Supervisor(spec)
        result = supervisor.run()
    except (SpecError, InjectError, LaunchError) as exc:
        raise UsageError(str(exc)) from None
    print_summary(result)
    announce_report(spec.state_dir, result.run_dir)
    if as_json:
        typer.echo(json_text(run_document(result)))
    raise typer.Exit(result.exit_code)


def _straggler_action(text: str) -> StragglerAction:
    try:
        return StragglerAction(text)
    except ValueError:
        known = " or ".join(a.value for a in StragglerAction)
        raise SpecError(f"--straggler-action must be {known} (got {text!r})") from None


def _preflight(state_dir: Path, nnodes: int, config: Path | None) -> None:
    """Gate the start on the quick health suite (and, with several nodes, the pairwise slow-node test)."""
    from kcover.health import HealthConfigError
    from kcover.health.preflight import run_preflight

    checkpoints = state_dir / "checkpoints"
    try:
        checkpoints.mkdir(parents=True, exist_ok=True)
        result = run_preflight(config=config, checkpoint_dir=checkpoints, simulate_nodes=nnodes if nnodes > 1 else 0)
    except OSError as error:
        raise UsageError(f"state dir {state_dir} is not writable: {error.strerror or error}") from None
    except (HealthConfigError, KeyError) as error:
        raise UsageError(f"preflight: {error}") from None
    if not result.passed:
        typer.echo(f"kcover: preflight failed, nothing started: {result.reason}", err=True)
        raise typer.Exit(ExitCode.FAILED)
    typer.echo(f"kcover: preflight passed ({result.reason})", err=True)
