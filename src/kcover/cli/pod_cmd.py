"""``kcover pod``: a pod's training processes, restarted in place on the operator's order.

The container's command becomes ``kcover pod -- python train.py``; the job's
pod template mounts the pod's ``kcover.io/generation`` annotation with the
downward API (see the README and :mod:`kcover.launcher.pod`).  Exit code: 0
when the workers succeeded; a failed worker's status when no restart was
ordered; 143 when stopped; 2 on a usage error (nothing started).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from kcover.cli.usage import UsageError


def pod(
    command: Annotated[list[str], typer.Argument(help="The training command, after `--`.")],
    nproc_per_node: Annotated[int, typer.Option(help="Worker processes in this pod.")] = 1,
    nnodes: Annotated[int | None, typer.Option(help="Pods in the job (default: KCOVER_NNODES, PET_NNODES or "
                                                    "WORLD_SIZE).", show_default=False)] = None,
    node_rank: Annotated[int | None, typer.Option(help="This pod's rank (default: KCOVER_NODE_RANK, "
                                                       "PET_NODE_RANK, JOB_COMPLETION_INDEX or RANK).",
                                                  show_default=False)] = None,
    master_addr: Annotated[str | None, typer.Option(help="Where the ranks meet (default: MASTER_ADDR).",
                                                    show_default=False)] = None,
    master_port: Annotated[int | None, typer.Option(help="The first rendezvous port (default: MASTER_PORT, "
                                                         "else 29500).", show_default=False)] = None,
    port_span: Annotated[int, typer.Option(help="Rendezvous ports used in turn, one per generation.")] = 2,
    generation_file: Annotated[Path, typer.Option(help="The pod's kcover.io/generation annotation, mounted "
                                                       "with the downward API.")]
    = Path("/etc/kcover/generation"),
    grace_period: Annotated[float, typer.Option(help="Seconds between SIGTERM and SIGKILL when the pod is stopped "
                                                     "(the emergency checkpoint's time).")] = 10.0,
    restart_grace: Annotated[float, typer.Option(help="Seconds between SIGTERM and SIGKILL when restarting workers "
                                                      "in place (their memory snapshot stays in the pod).")] = 2.0,
    order_wait: Annotated[float, typer.Option(help="Seconds a failed pod waits for a restart order before it "
                                                   "exits with the worker's status.")] = 120.0,
    warm: Annotated[bool, typer.Option(help="Keep the next generation's Python workers started, their imports "
                                            "done (a `python script.py` or `python -m module` command).")] = True,
    preload: Annotated[str, typer.Option(help="Modules a warm worker imports while it waits (comma-separated; "
                                              "missing ones are skipped).")] = "torch,torch.distributed,torch._dynamo",
    assigned_rank: Annotated[bool, typer.Option(help="The operator assigns this pod's rank (kcover.io/rank, mounted "
                                                     "as `rank` beside the generation file); until then the pod "
                                                     "waits as a warm standby. For jobs with kcover.io/standby.",
                                                envvar="KCOVER_ASSIGNED_RANK")] = False,
) -> None:
    """Run a pod's training processes; restart them in place when the kcover operator orders it."""
    from kcover.launcher.pod import PodSpecError, PodSupervisor, pod_spec
    from kcover.launcher.workers import LaunchError

    try:
        spec = pod_spec(tuple(command), os.environ, nproc_per_node=nproc_per_node, nnodes=nnodes,
                        node_rank=node_rank, master_addr=master_addr, master_port=master_port,
                        port_span=port_span, generation_file=generation_file, grace_period=grace_period,
                        order_wait=order_wait, restart_grace=restart_grace, warm=warm,
                        preload=preload, assigned_rank=assigned_rank)
        code = PodSupervisor(spec).run()
    except (PodSpecError, LaunchError) as exc:
        raise UsageError(str(exc)) from None
    raise typer.Exit(code)
