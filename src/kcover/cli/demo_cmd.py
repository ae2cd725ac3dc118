"""``kcover demo``: watch kcover recover a real DDP training from a GPU fault and a hang.

Runs :mod:`kcover.demo.train_ddp` (PyTorch DDP, gloo on CPU, NCCL on GPUs) as 2
simulated nodes × 2 workers with one spare node, and injects two faults: Xid 79
on node-1 at step 12 (the node is excluded and the spare takes its place) and a
hang of rank 0 at step 35 (detected after 5 s, stacks captured).  The job then
finishes from its last checkpoint.  About a minute on two cores.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from kcover.cli.report_cmd import announce_report
from kcover.cli.usage import UsageError
from kcover.collect.printable import json_text
from kcover.decide.policy import RecoveryPolicy
from kcover.launcher import statedir
from kcover.launcher.inject import parse_injections
from kcover.launcher.reporting import print_summary, run_document
from kcover.launcher.spec import RunSpec, SpecError
from kcover.launcher.supervisor import Supervisor

STEPS = 50


def demo(
    state_dir: Annotated[Path, typer.Option(help="Where the demo keeps logs and checkpoints.")]
    = Path(".kcover-demo"),
    as_json: Annotated[bool, typer.Option("--json", help="Also print the run's JSON document.")] = False,
) -> None:
    """Recover a real DDP training from an injected GPU fault and a hang, live."""
    try:
        import torch  # noqa: F401
    except ImportError:
        raise UsageError("the demo needs PyTorch: pip install 'kcover[torch]'") from None
    from kcover.demo.live import LiveReporter

    try:
        statedir.wipe(state_dir)  # a fresh start, but never under a run that holds this state dir
    except SpecError as exc:
        raise UsageError(str(exc)) from None
    spec = RunSpec(
        command=(sys.executable, "-m", "kcover.demo.train_ddp", "--steps", str(STEPS)),
        nproc_per_node=2, nnodes=2, spare_nodes=1, state_dir=state_dir,
        policy=RecoveryPolicy(max_restarts=3), hang_timeout=5.0, startup_timeout=120.0, grace_period=3.0,
        injections=tuple(parse_injections("xid79@node-1:step=12,hang@rank0:step=35")), echo=False,
    )
    with LiveReporter(STEPS) as reporter:
        result = Supervisor(spec, reporter=reporter).run()
    print_summary(result)
    announce_report(spec.state_dir, result.run_dir)
    typer.echo(f"worker logs, kernel messages, stacks and checkpoints: {state_dir}/", err=True)
    if as_json:
        typer.echo(json_text(run_document(result)))
    raise typer.Exit(result.exit_code)
