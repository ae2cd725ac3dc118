"""What ``kcover run`` was asked to do, checked before anything starts.

:class:`RunSpec` holds the command and the options; :func:`check_options`
refuses option values that cannot be honoured (``nan``, ``inf``, zero or
negative timeouts, more minimum nodes than nodes, more workers than one machine
can start), naming the option, the value and what is allowed; :func:`validate`
does that first and then refuses a command that cannot run or a state dir that
cannot be written (exit 2, nothing started).  :func:`worker_specs` lays the ranks out
on simulated nodes and builds each worker's environment: the variables
``torchrun`` sets, so an unchanged torchrun script runs, plus ``KCOVER_*``
(each node's own shared memory: :mod:`~kcover.launcher.node_memory`).
"""

from __future__ import annotations

import math
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kcover.decide.policy import RecoveryPolicy
from kcover.decide.straggler_action import StragglerAction
from kcover.launcher.inject import Injection
from kcover.launcher.node_memory import memory_root, node_memory
from kcover.launcher.workers import WorkerSpec, torchrun_env


class SpecError(ValueError):
    """A user mistake in the run's command or options; the message names it."""


@dataclass(frozen=True)
class RunSpec:
    command: tuple[str, ...]
    nproc_per_node: int = 1
    nnodes: int = 1
    spare_nodes: int = 0
    state_dir: Path = Path(".kcover")
    policy: RecoveryPolicy = field(default_factory=RecoveryPolicy)
    hang_timeout: float | None = None
    startup_timeout: float = 900.0
    grace_period: float = 10.0
    settle: float = 0.2
    injections: tuple[Injection, ...] = ()
    echo: bool = True
    master_port: int | None = None
    straggler_action: StragglerAction = StragglerAction.REPORT
    total_steps: int | None = None
    """The job's total steps: what ``--straggler-action replace`` weighs the remaining time by."""

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.nnodes

    def node_names(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """Active nodes and spare nodes: ``node-0 …`` then the spares."""
        names = tuple(f"node-{i}" for i in range(self.nnodes + self.spare_nodes))
        return names[: self.nnodes], names[self.nnodes :]


MAX_WORKERS = 4096  # ranks (active and spare nodes together) one machine is asked to start
MAX_SECONDS = 30 * 86400
MAX_RESTARTS = 1_000_000
MAX_STEPS = 10**12


def _count(option: str, value: int, low: int, high: int, high_text: str = "") -> None:
    if not low <= value <= high:
        raise SpecError(f"{option} must be a whole number from {low} to {high_text or high} (got {value})")


def _seconds(option: str, value: float, *, zero_allowed: bool = False) -> None:
    low_ok = value >= 0 if zero_allowed else value > 0
    if not (math.isfinite(value) and low_ok and value <= MAX_SECONDS):
        low = "from 0" if zero_allowed else "greater than 0"
        raise SpecError(f"{option} must be a number of seconds {low} and at most {MAX_SECONDS} (30 days) "
                        f"(got {value:g})")


def check_options(spec: RunSpec) -> None:
    """Refuse option values that cannot be honoured; the message names the option, the value and the range."""
    _count("--nproc-per-node", spec.nproc_per_node, 1, MAX_WORKERS)
    _count("--nnodes", spec.nnodes, 1, MAX_WORKERS)
    _count("--spare-nodes", spec.spare_nodes, 0, MAX_WORKERS)
    workers = spec.nproc_per_node * (spec.nnodes + spec.spare_nodes)
    if workers > MAX_WORKERS:
        raise SpecError(f"--nproc-per-node × (--nnodes + --spare-nodes) must be at most {MAX_WORKERS} workers "
                        f"on one machine (got {workers})")
    if spec.policy.min_nodes is not None:
        _count("--min-nodes", spec.policy.min_nodes, 1, spec.nnodes, f"--nnodes ({spec.nnodes})")
    _count("--max-restarts", spec.policy.max_restarts, 0, MAX_RESTARTS)
    _count("--user-code-retries", spec.policy.user_code_retries, 0, MAX_RESTARTS)
    _seconds("--backoff", spec.policy.backoff_initial, zero_allowed=True)
    if spec.hang_timeout is not None:
        _seconds("--hang-timeout", spec.hang_timeout)
    _seconds("--startup-timeout", spec.startup_timeout)
    _seconds("--grace-period", spec.grace_period, zero_allowed=True)
    if spec.total_steps is not None:
        _count("--total-steps", spec.total_steps, 1, MAX_STEPS, "10^12")


def validate(spec: RunSpec) -> None:
    check_options(spec)
    if not spec.command:
        raise SpecError("no command given: kcover run [OPTIONS] -- COMMAND [ARGS…]")
    program = spec.command[0]
    if os.sep in program:
        if not Path(program).is_file():
            raise SpecError(f"command not found: {program}")
        if not os.access(program, os.X_OK):
            raise SpecError(f"command is not executable: {program}")
    elif shutil.which(program) is None:
        raise SpecError(f"command not found on PATH: {program}")
    try:
        spec.state_dir.mkdir(parents=True, exist_ok=True)
        probe = spec.state_dir / f".write-test-{os.getpid()}"
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        raise SpecError(f"state dir {spec.state_dir} is not writable: {exc.strerror or exc}") from None
    all_nodes = sum(spec.node_names(), ())
    for injection in spec.injections:
        target = injection.target
        if target.startswith("rank") and int(target[4:]) >= spec.world_size:
            raise SpecError(f"injection target {target} is outside the world size {spec.world_size}")
        if target.startswith("node-") and target not in all_nodes:
            raise SpecError(f"injection target {target} is not one of the nodes {', '.join(all_nodes)}")


def worker_specs(
    spec: RunSpec, nodes: Sequence[str], attempt: int, restarts: int, master_port: int, attempt_dir: Path
) -> list[WorkerSpec]:
    """One spec per rank, ranks laid out node by node; each node with a shared-memory folder of its own."""
    world = spec.nproc_per_node * len(nodes)
    specs = []
    memory = memory_root(spec.state_dir)
    for group_rank, node in enumerate(nodes):
        folder = node_memory(memory, node) if memory is not None else None
        shared = {"KCOVER_SHARED_MEMORY": str(folder)} if folder is not None else {}
        for local_rank in range(spec.nproc_per_node):
            rank = group_rank * spec.nproc_per_node + local_rank
            env = dict(os.environ)
            env.update(torchrun_env(rank, local_rank, world, spec.nproc_per_node, group_rank, "127.0.0.1",
                                    master_port, restarts, spec.policy.max_restarts, f"kcover-{attempt}"))
            env.update({
                "KCOVER_RANK": str(rank), "KCOVER_NODE": node, "KCOVER_ATTEMPT": str(attempt),
                "KCOVER_RESTART_COUNT": str(restarts), "KCOVER_STATE_DIR": str(spec.state_dir.resolve()),
                "KCOVER_CHECKPOINT_DIR": str((spec.state_dir / "checkpoints").resolve()),
                "KCOVER_ERROR_FILE": str((attempt_dir / f"error-rank{rank}.json").resolve()),
                "TORCHELASTIC_ERROR_FILE": str((attempt_dir / f"error-rank{rank}.json").resolve()),
                **shared,
            })
            specs.append(WorkerSpec(rank, local_rank, node, group_rank, spec.command, env))
    return specs
