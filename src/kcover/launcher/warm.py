"""Warm workers for ``kcover pod``: the next generation's processes, started and imported ahead of time.

Most of a rank's restart is its start: the interpreter, ``import torch`` (3 s
here) and the modules torch loads on first use (``torch._dynamo``, 2 s more
when DDP is built).  When the training command is ``python script.py …`` or
``python -m module …``, :class:`WarmSpares` keeps one warm process per local
rank (:mod:`kcover.launcher.zygote`) that has already imported
``--preload`` and waits; a restart hands each one its order (the new
generation's environment) and it runs the script as ``python`` would, with the
imports done.  A spare is started only once the current generation has
stepped (or after :data:`SPAWN_AFTER` seconds), so it never competes with the
generation's own start; a spare that died meanwhile, or a command of another
form, starts cold as before.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kcover.launcher import zygote
from kcover.launcher.workers import HELPERS, Worker, WorkerSpec, start_worker, with_auto_timing

SPAWN_AFTER = 30.0
DEFAULT_PRELOAD = "torch,torch.distributed,torch._dynamo"
_PYTHON_FLAGS = frozenset({"-u", "-B", "-O"})


@dataclass(frozen=True)
class PythonCommand:
    """A training command of a form a warm worker can run: the interpreter, then a script or ``-m`` module."""

    interpreter: str
    kind: str  # "script" or "module"
    target: str
    args: tuple[str, ...]


def python_command(command: Sequence[str]) -> PythonCommand | None:
    """``command`` as a Python script or module run; None for anything else (other flags, ``-c``, a binary)."""
    if not command or not Path(command[0]).name.startswith("python"):
        return None
    rest = list(command[1:])
    while rest and rest[0] in _PYTHON_FLAGS:
        rest.pop(0)
    if len(rest) >= 2 and rest[0] == "-m":
        return PythonCommand(command[0], "module", rest[1], tuple(rest[2:]))
    if rest and not rest[0].startswith("-"):
        return PythonCommand(command[0], "script", rest[0], tuple(rest[1:]))
    return None


@dataclass
class Spare:
    """A warm process and the write end of its order pipe."""

    worker: Worker
    orders: int


class WarmSpares:
    """One warm process per local rank, for the next generation (see the module docstring)."""

    def __init__(self, command: Sequence[str], preload: str = DEFAULT_PRELOAD) -> None:
        self.python = python_command(command)
        self.preload = preload
        self.spares: dict[int, Spare] = {}

    @property
    def enabled(self) -> bool:
        return self.python is not None

    def due(self, generation_began: float, stepped: bool, now: float) -> bool:
        """Whether to start the spares now: none yet, and the generation has stepped or had its time."""
        return self.enabled and not self.spares and (stepped or now - generation_began >= SPAWN_AFTER)

    def spawn(self, specs: Sequence[WorkerSpec]) -> None:
        """Start a warm process for each spec (the next generation's ranks, with its expected environment)."""
        assert self.python is not None
        for spec in specs:
            read, write = os.pipe()
            command = (self.python.interpreter, zygote.__file__, self.preload)
            env = {**spec.env, "KCOVER_ZYGOTE_FD": str(read)}
            try:
                worker = start_worker(WorkerSpec(spec.rank, spec.local_rank, spec.node, spec.group_rank, command,
                                                 env, spec.cwd), capture_output=False, pass_fds=(read,))
            except Exception:
                os.close(write)
                raise
            finally:
                os.close(read)
            HELPERS.add(worker.pid)  # not a worker yet: stopping a generation must not take it
            self.spares[spec.local_rank] = Spare(worker, write)

    def take(self, spec: WorkerSpec) -> Worker | None:
        """The warm process for ``spec``'s rank, now running its command; None when there is none alive."""
        spare = self.spares.pop(spec.local_rank, None)
        if spare is None or self.python is None:
            return None
        HELPERS.discard(spare.worker.pid)
        if spare.worker.process.poll() is not None:  # it died waiting: its pipes closed, the rank starts cold
            os.close(spare.orders)
            _kill(spare.worker)
            return None
        order = {"env": with_auto_timing(spec.env), "cwd": str(spec.cwd or os.getcwd()), "kind": self.python.kind,
                 "target": self.python.target, "args": list(self.python.args)}
        try:
            with os.fdopen(spare.orders, "wb") as pipe:
                pipe.write(json.dumps(order).encode())
        except OSError:
            _kill(spare.worker)
            return None
        spare.worker.spec = spec
        spare.worker.started = time.monotonic()
        return spare.worker

    def close(self) -> None:
        """Dismiss every spare: its pipe closed without an order, then killed should it linger."""
        for spare in self.spares.values():
            with contextlib.suppress(OSError):
                os.close(spare.orders)
            _kill(spare.worker)
        self.spares.clear()


def _kill(worker: Worker) -> None:
    HELPERS.discard(worker.pid)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(worker.pid, signal.SIGKILL)
    with contextlib.suppress(Exception):
        worker.process.wait(timeout=5)
    for stream in (worker.process.stdout, worker.process.stderr):
        if stream is not None:
            stream.close()
    with contextlib.suppress(OSError):
        os.close(worker.progress_read)
