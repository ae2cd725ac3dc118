"""Step timing without code changes: kcover times a DistributedDataParallel rank's compute by itself.

``kcover run`` and ``kcover pod`` put this folder first on the workers'
``PYTHONPATH``, so Python runs this file at start-up as ``sitecustomize``.  It
imports nothing of kcover (the worker's Python may not have kcover installed)
and only modules Python has loaded already (``os``, ``sys``, ``weakref``): it
waits, through an import hook, for ``torch.nn.parallel.distributed``.  When
that module loads, the newest ``DistributedDataParallel`` built gets a *timer*:

* a forward pre-hook notes when a step's compute begins (the first training
  forward with gradients on after the last step ended: gradient accumulation
  windows count as one step; ``no_grad`` or ``eval()`` forwards start nothing);
* a post-hook on each parameter's gradient accumulator notes when the last
  gradient of the step's synchronised backward is ready on this rank
  (``no_sync`` micro-batches go on): the local compute is done, and what
  follows is waiting for the other ranks' gradients.

The difference is written as ``time <step> <seconds>`` to kcover's pipe
(``KCOVER_PROGRESS_FD``; ``KCOVER_PROGRESS_PIPE`` names it, so a child process
that inherited the variables but not the pipe writes nothing), exactly what
``kcover.step_time`` writes, one step late (sent as the next step begins, so
on CUDA the events are read without blocking the GPU's queue).  On CUDA the
two moments are CUDA events on the model's device's current stream, so the
figure is the GPU's own compute time, not the CPU's launch pace; the end event
is recorded only by the parameter whose gradient came last the step before (a
step whose order changed is not timed).

DDP's communication is left as it was: no communication hook is registered,
so a script's own hooks, built-in or not, work as without kcover.  Nothing is
stored on the model or its parameters (it pickles and copies as before, and a
model deleted is freed with its hooks).  Under ``torch.compile`` the pre-hook
runs eagerly (``torch.compiler.disable``): one graph break more, where DDP's
own forward breaks the graph anyway.  A script that reports its own timings
(``kcover.timed`` / ``kcover.step_time``) wins: the first such call stops the
timer.  ``KCOVER_AUTO_TIMING=0`` turns it off; without ``KCOVER_PROGRESS_FD``
(not under kcover) nothing is installed.  Any failure inside turns the timer
off and never reaches the training.

Finally the next ``sitecustomize`` on the path after this folder (the
environment's own, if any) runs as it would have without this one, and is what
``import sitecustomize`` gives.
"""

from __future__ import annotations

import os
import sys
import weakref
from math import isfinite
from time import perf_counter

MYPY = False
if MYPY:  # type names only: typing is not imported at start-up
    from types import ModuleType
    from typing import Any

TARGET = "torch.nn.parallel.distributed"
FD_VARIABLE = "KCOVER_PROGRESS_FD"
PIPE_VARIABLE = "KCOVER_PROGRESS_PIPE"
SWITCH_VARIABLE = "KCOVER_AUTO_TIMING"
MAX_PENDING = 8
"""CUDA steps whose events are not complete yet, kept at most (the oldest is dropped)."""

_state: dict[str, Any] = {"quiet": False, "pid": 0, "step": 0, "timed": None}
"""``quiet``: nothing is sent any more (the script times itself, or nobody reads the pipe); ``pid``: the
process that checked the pipe is kcover's; ``step``: the process's step count (one numbering for every model it
times, so a rebuilt model goes on from there); ``timed``: a weak reference to the DDP module timed now."""


def wanted() -> bool:
    """Whether this process runs under kcover with automatic timing on."""
    return bool(os.environ.get(FD_VARIABLE)) and os.environ.get(SWITCH_VARIABLE, "1") != "0"


def yield_to_sdk() -> None:
    """Called by ``kcover.step_time``: the script times itself, so the timers stay quiet from now on."""
    _state["quiet"] = True


def kcovers_pipe(descriptor: int) -> bool:
    """Whether ``descriptor`` is the pipe kcover gave this worker: a child process inherits the variable but not
    the pipe, and its descriptor of that number may be a log file or a socket (never written to then)."""
    identity = os.environ.get(PIPE_VARIABLE)
    if not identity:
        return True  # an older launcher, or a test giving only the descriptor
    found = os.fstat(descriptor)
    return f"{found.st_dev}:{found.st_ino}" == identity


def send(step: int, seconds: float) -> None:
    """Write one timing to kcover's pipe; a closed, bad or foreign descriptor ends the sending quietly."""
    descriptor = os.environ.get(FD_VARIABLE)
    if not descriptor or _state["quiet"] or not (isfinite(seconds) and seconds > 0):
        return
    try:
        if _state["pid"] != os.getpid():
            if not kcovers_pipe(int(descriptor)):
                raise ValueError("not kcover's pipe")
            _state["pid"] = os.getpid()
        os.write(int(descriptor), f"time {step} {seconds:.6g}\n".encode())
    except (OSError, ValueError):
        _state["quiet"] = True  # nobody reads: stop for good, as kcover.sdk does


class StepTimer:
    """The compute time of each step of one DDP module: forward began → the last gradient of the step ready.

    It holds the module weakly, and the gradient hooks hold it weakly: a module deleted is freed, its hooks
    removed (``weakref.finalize``)."""

    def __init__(self, module: Any, torch: Any) -> None:
        self.module = weakref.ref(module)
        self.torch = torch
        self.cuda = getattr(module, "device_type", "cpu") == "cuda"
        self.device = _device_of(module) if self.cuda else None
        self.began: Any = None
        self.ready: Any = None
        """When the newest gradient of this step's synchronised backward was ready (on CUDA: an event)."""
        self.sync = True
        """Whether the newest forward's backward synchronises (DDP decides it at the forward, ``no_sync``)."""
        self.last = -1
        self.expected = -1
        """On CUDA: the parameter whose gradient came last in the step before, the one that records an event."""
        self.pending: list[tuple[int, Any, Any]] = []
        self.off = False
        self.hook_id = -1

    def _now(self) -> Any:
        if not self.cuda:
            return perf_counter()
        event = self.torch.cuda.Event(enable_timing=True)
        event.record(self.torch.cuda.current_stream(self.device))
        return event

    def forward_began(self, module: Any, _inputs: Any) -> None:
        """DDP's forward pre-hook.  Whatever goes wrong here (a CUDA graph being captured, say) turns this timer
        off and never reaches the training."""
        if self.off:
            return
        try:
            self._forward_began(module)
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

    def _forward_began(self, module: Any) -> None:
        if not self.torch.is_grad_enabled() or not module.training:
            return  # evaluation: not a step's compute
        self.sync = bool(module.require_backward_grad_sync)
        if self.began is not None and self.last < 0:
            return  # a further forward of the same step (gradient accumulation, a second loss)
        if self.began is not None:
            if self.ready is not None and (not self.cuda or self.last == self.expected):
                self.pending = [*self.pending, (_state["step"], self.began, self.ready)][-MAX_PENDING:]
            _state["step"] += 1
        self.expected, self.last, self.ready = self.last, -1, None
        self._flush()
        self.began = self._now()

    def _gradient_ready(self, index: int) -> None:
        if self.began is None or not self.sync:
            return  # a micro-batch under no_sync: the step goes on
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
            del self.pending[0]
            send(step, seconds)


def _device_of(module: Any) -> Any:
    ids = getattr(module, "device_ids", None)
    return ids[0] if ids else next(module.parameters()).device


def _gradient_hook(timer: weakref.ref[StepTimer], index: int) -> Any:
    def hook(*_: Any) -> None:
        alive = timer()
        if alive is not None:
            alive.gradient_ready(index)
    return hook


def _remove(handles: list[Any]) -> None:
    for handle in handles:
        handle.remove()


def attach(module: Any) -> None:
    """Time ``module``, a DDP model just built (the newest one only: an earlier one's timer stops, so a GAN's two
    models or a model rebuilt never mix their steps), with a forward pre-hook and a post-hook on each parameter's
    gradient accumulator: nothing is stored on the parameters or in the model's attributes, so it pickles and
    copies as before."""
    import torch
    if not wanted() or getattr(module, "_use_python_reducer", False):
        return  # off, or compiled autograd (it would trace the hooks)
    earlier = _state["timed"]() if _state["timed"] is not None else None
    if earlier is not None and earlier in TIMERS:
        TIMERS[earlier][0].off = True  # one model at a time: the newest (every rank builds them alike)
    timer = StepTimer(module, torch)
    reference = weakref.ref(timer)
    handles, accumulators = [], []
    with torch.enable_grad():
        for index, parameter in enumerate(p for p in module.parameters() if p.requires_grad):
            accumulator = parameter.view_as(parameter).grad_fn.next_functions[0][0]
            accumulators.append(accumulator)  # kept alive with the timer, as DDP keeps them
            handles.append(accumulator.register_hook(_gradient_hook(reference, index)))
    began: Any = timer.forward_began
    if "torch._dynamo" in sys.modules:  # DDP imported it already; torch.compile(ddp) then runs this eagerly
        compiler: Any = torch.compiler
        began = compiler.disable(began)
    handles.append(module.register_forward_pre_hook(began))
    timer.hook_id = handles[-1].id
    TIMERS[module] = (timer, accumulators)
    _state["timed"] = weakref.ref(module)
    weakref.finalize(module, _remove, handles)


TIMERS: weakref.WeakKeyDictionary[Any, tuple[StepTimer, list[Any]]] = weakref.WeakKeyDictionary()
"""The timed DDP module → its timer and gradient accumulators (kept alive as long as the module is)."""


def patch(distributed: ModuleType) -> None:
    """Time each new DDP module as its reducer is built (``_ddp_init_helper``: at the end of ``__init__``, and
    again when an unpickled copy is rebuilt), and leave kcover's hook out of a pickled or copied one."""
    ddp = distributed.DistributedDataParallel
    name = "_ddp_init_helper" if hasattr(ddp, "_ddp_init_helper") else "__init__"
    built, pickled = getattr(ddp, name), ddp.__getstate__

    def after_build(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = built(self, *args, **kwargs)
        try:  # noqa: SIM105 - contextlib is not imported at start-up
            attach(self)
        except Exception:
            pass  # untimed, never broken
        return result

    def __getstate__(self: Any) -> Any:  # noqa: N807 - it replaces DDP's own
        state = pickled(self)
        timer = TIMERS.get(self)
        if timer is not None and isinstance(state, dict) and "_forward_pre_hooks" in state:
            state = {**state, "_forward_pre_hooks": state["_forward_pre_hooks"].copy()}
            state["_forward_pre_hooks"].pop(timer[0].hook_id, None)
        return state

    for function, original in ((after_build, built), (__getstate__, pickled)):
        function.__name__, function.__qualname__ = original.__name__, original.__qualname__
        function.__doc__, function.__wrapped__ = original.__doc__, original  # type: ignore[attr-defined]
        setattr(ddp, original.__name__, function)


class AfterImport:
    """An import hook (on ``sys.meta_path``) that runs :func:`patch` on :data:`TARGET` right after it is
    imported, then leaves.  A plain class: ``importlib.abc`` would import a dozen modules at every start-up."""

    def __init__(self) -> None:
        self.busy = False

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != TARGET or self.busy:
            return None
        self.busy = True
        try:
            spec = next(filter(None, (finder.find_spec(name, path, target) for finder in sys.meta_path
                                      if finder is not self and hasattr(finder, "find_spec"))), None)
        finally:
            self.busy = False
        loader: Any = getattr(spec, "loader", None)
        if spec is None or not hasattr(loader, "exec_module"):
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        execute = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            execute(module)
            try:  # noqa: SIM105 - contextlib is not imported at start-up
                patch(module)
            except Exception:
                pass  # untimed, never broken

        loader.exec_module = exec_module
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
    """Run the ``sitecustomize`` this one shadows — the next one on ``sys.path`` after this folder — as Python
    would have (its errors are its own), and let ``import sitecustomize`` find that one."""
    here = os.path.realpath(os.path.dirname(os.path.abspath(__file__)))
    entries = [os.path.realpath(entry or os.curdir) for entry in sys.path]
    after = sys.path[entries.index(here) + 1:] if here in entries else sys.path
    from importlib.machinery import PathFinder
    spec = PathFinder.find_spec("sitecustomize", [e for e in after if os.path.realpath(e or os.curdir) != here])
    if spec is None or spec.loader is None:
        return
    from importlib.util import module_from_spec
    module = module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


if __name__ == "sitecustomize" and "kcover_autotime" not in sys.modules:  # Python's start-up, once
    sys.modules["kcover_autotime"] = sys.modules[__name__]
    try:  # noqa: SIM105 - contextlib is not imported at start-up
        install()
    except Exception:
        pass  # untimed, never broken
    run_next_sitecustomize()
