"""Step timing without code changes: kcover times every DistributedDataParallel rank's compute by itself.

``kcover run`` and ``kcover pod`` put this folder first on the workers'
``PYTHONPATH``, so Python runs this file at start-up as ``sitecustomize``.  It
imports nothing of kcover (the worker's Python may not have kcover installed)
and nothing heavy: it only waits, through an import hook, for
``torch.nn.parallel.distributed``.  When that module loads, every
``DistributedDataParallel`` built afterwards gets a *timer*:

* a forward pre-hook notes when a step's compute begins (the first forward
  with gradients on after the last step ended: gradient accumulation windows
  count as one step, ``no_grad`` evaluation forwards start nothing);
* a hook on each parameter's gradient notes when the last gradient of the
  step's synchronised backward is accumulated on this rank (``no_sync``
  micro-batches go on): the local compute is done, and what follows is
  waiting for the other ranks' gradients.

The difference is written as ``time <step> <seconds>`` to the pipe named by
``KCOVER_PROGRESS_FD``, exactly what ``kcover.step_time`` writes, one step
late (the step's timing is sent as the next step begins, so on CUDA the
events can be read without blocking the GPU's queue).  On CUDA the two
moments are CUDA events on the compute stream, so the figure is the GPU's own
compute time, not the CPU's launch pace; the end event is recorded only by the
parameter whose gradient came last in the step before (a step whose order
changed is not timed).

DDP's communication is left exactly as it was: no communication hook is
registered, so a script's own hooks, built-in or not, work as without kcover.
A script that reports its own timings (``kcover.timed`` /
``kcover.step_time``) wins: the first such call stops every timer in that
process.  ``KCOVER_AUTO_TIMING=0`` turns it off; without
``KCOVER_PROGRESS_FD`` (not under kcover) nothing is installed.  Any failure
inside leaves the training exactly as it would run without kcover.

Finally the next ``sitecustomize`` on the path (the environment's own, if any)
runs as it would have without this one.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import importlib.util
import math
import os
import sys
from collections import deque
from time import perf_counter
from types import ModuleType
from typing import Any

TARGET = "torch.nn.parallel.distributed"
FD_VARIABLE = "KCOVER_PROGRESS_FD"
SWITCH_VARIABLE = "KCOVER_AUTO_TIMING"
MAX_PENDING = 8
"""CUDA steps whose events are not complete yet, kept at most (the oldest is dropped)."""

_state = {"quiet": False}
"""``quiet``: no timer sends any more (the script reports its own timings, or nobody reads the pipe)."""


def wanted() -> bool:
    """Whether this process runs under kcover with automatic timing on."""
    return bool(os.environ.get(FD_VARIABLE)) and os.environ.get(SWITCH_VARIABLE, "1") != "0"


def yield_to_sdk() -> None:
    """Called by ``kcover.step_time``: the script times itself, so the timers stay quiet from now on."""
    _state["quiet"] = True


def send(step: int, seconds: float) -> None:
    """Write one timing to kcover's pipe; a closed or bad pipe ends the sending quietly."""
    descriptor = os.environ.get(FD_VARIABLE)
    if not descriptor or _state["quiet"] or not (math.isfinite(seconds) and seconds > 0):
        return
    try:
        os.write(int(descriptor), f"time {step} {seconds:.6g}\n".encode())
    except (OSError, ValueError):
        _state["quiet"] = True  # nobody reads: stop for good, as kcover.sdk does


class StepTimer:
    """The compute time of each step of one DDP module: forward began → the last gradient of the step ready."""

    def __init__(self, module: Any, torch: Any) -> None:
        self.module = module
        self.torch = torch
        self.cuda = getattr(module, "device_type", "cpu") == "cuda"
        self.step = 0
        self.began: Any = None
        self.ready: Any = None
        """When the newest gradient of this step's synchronised backward was ready (on CUDA: an event)."""
        self.last = -1
        self.expected = -1
        """On CUDA: the parameter whose gradient came last in the step before, the one that records an event."""
        self.pending: deque[tuple[int, Any, Any]] = deque()
        self.off = False

    def _now(self) -> Any:
        if not self.cuda:
            return perf_counter()
        event = self.torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def forward_began(self, _module: Any, _inputs: Any) -> None:
        """DDP's forward pre-hook.  Whatever goes wrong here (a CUDA graph being captured, say) turns this timer
        off and never reaches the training."""
        if self.off:
            return
        try:
            self._forward_began()
        except Exception:
            self.off = True

    def gradient_ready(self, index: int) -> None:
        """A parameter's gradient is accumulated (its hook); a failure turns this timer off, as above."""
        if self.off:
            return
        try:
            self._gradient_ready(index)
        except Exception:
            self.off = True

    def _forward_began(self) -> None:
        if not self.torch.is_grad_enabled():
            return  # evaluation: not a step's compute
        if self.began is not None and self.last < 0:
            return  # a further forward of the same step (gradient accumulation, a second loss)
        if self.began is not None:
            if self.ready is not None and (not self.cuda or self.last == self.expected):
                self.pending.append((self.step, self.began, self.ready))
                while len(self.pending) > MAX_PENDING:
                    self.pending.popleft()
            self.step += 1
        self.expected, self.last, self.ready = self.last, -1, None
        self._flush()
        self.began = self._now()

    def _gradient_ready(self, index: int) -> None:
        """Under ``no_sync`` (a micro-batch) the step goes on."""
        if self.began is None or not self.module.require_backward_grad_sync:
            return
        self.last = index
        if not self.cuda:
            self.ready = perf_counter()
        elif index == self.expected:
            self.ready = self._now()

    def _flush(self) -> None:
        while self.pending:
            step, began, ended = self.pending[0]
            if not self.cuda:
                seconds = ended - began
            elif ended.query():
                seconds = began.elapsed_time(ended) / 1000
            else:
                return
            self.pending.popleft()
            send(step, seconds)


def attach(module: Any) -> None:
    """Give a freshly built DDP module a timer: a forward pre-hook and a hook on each parameter's gradient."""
    torch: Any = importlib.import_module("torch")
    if not wanted() or getattr(module, "_use_python_reducer", False):
        return  # off, or compiled autograd (it would trace the gradient hooks): untimed
    timer = StepTimer(module, torch)
    parameters = [p for p in module.parameters() if p.requires_grad]
    for index, parameter in enumerate(parameters):
        parameter.register_post_accumulate_grad_hook(lambda _p, i=index: timer.gradient_ready(i))
    began = timer.forward_began
    if "torch._dynamo" in sys.modules:  # DDP imported it already; torch.compile(ddp) then runs this eagerly
        began = torch.compiler.disable(began)
    module.register_forward_pre_hook(began)
    module._kcover_timer = timer


def patch(distributed: ModuleType) -> None:
    """Wrap ``DistributedDataParallel.__init__`` so that each new instance gets a timer."""
    ddp = distributed.DistributedDataParallel
    built = ddp.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:  # noqa: N807 - it replaces DDP's own
        built(self, *args, **kwargs)
        with contextlib.suppress(Exception):
            attach(self)

    __init__.__qualname__, __init__.__doc__ = built.__qualname__, built.__doc__
    __init__.__wrapped__ = built  # type: ignore[attr-defined]
    ddp.__init__ = __init__


class AfterImport(importlib.abc.MetaPathFinder):
    """Runs :func:`patch` on :data:`TARGET` right after it is imported, then leaves ``sys.meta_path``."""

    def __init__(self) -> None:
        self.busy = False

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name != TARGET or self.busy:
            return None
        self.busy = True
        try:
            spec = next(filter(None, (finder.find_spec(name, path, target) for finder in sys.meta_path
                                      if finder is not self and hasattr(finder, "find_spec"))), None)
        finally:
            self.busy = False
        loader = spec.loader if spec is not None else None
        if spec is None or not isinstance(loader, importlib.abc.Loader):
            return None
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self)
        execute = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            execute(module)
            with contextlib.suppress(Exception):
                patch(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def install() -> None:
    """Wait for torch's DDP module (or patch it now if already loaded) when kcover wants timings."""
    if not wanted():
        return
    if TARGET in sys.modules:
        patch(sys.modules[TARGET])
    else:
        sys.meta_path.insert(0, AfterImport())


def run_next_sitecustomize() -> None:
    """Run the ``sitecustomize`` this one shadows, as Python would have (its errors are its own)."""
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [entry for entry in sys.path if os.path.abspath(entry or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


if __name__ == "sitecustomize":  # Python's start-up, not an import by kcover's tests or tools
    sys.modules.setdefault("kcover_autotime", sys.modules[__name__])
    with contextlib.suppress(Exception):
        install()
    run_next_sitecustomize()
