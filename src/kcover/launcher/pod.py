"""``kcover pod``: the training processes of one pod, restarted in place when the operator says so.

On Kubernetes, restarting a job by recreating its pods costs a scheduling round,
a container start, the imports and the in-memory snapshots of every pod.  With
``kcover pod -- python train.py`` as the container's command, the pod outlives
its workers instead:

- it reads where it stands from the job's environment (:class:`PodSpec`: the
  Indexed Job's completion index, a PyTorchJob's ``RANK``/``WORLD_SIZE``,
  torchrun's ``PET_*``, or options) and starts ``--nproc-per-node`` workers
  with the variables ``torchrun`` sets;
- it watches its *generation file* — the pod's ``kcover.io/generation``
  annotation projected by the downward API, which the kubelet rewrites a
  fraction of a second after the operator changes it;
- when the generation goes up, it stops its workers (SIGTERM, ``--restart-grace``
  seconds, then SIGKILL: the memory snapshot stays in the pod) and starts them again for the new
  generation — from warm processes that imported torch beforehand when the
  command is ``python script.py`` or ``python -m module``
  (:mod:`kcover.launcher.warm`) — on the next of ``--port-span`` rendezvous
  ports, so a new generation never meets a rank of the old one; every rank
  waits in the new rendezvous until all pods have come, which is the barrier,
  and restores from the memory snapshot that survived in the pod;
- when a worker fails it stops the pod's other workers, reports it, and waits
  ``--order-wait`` seconds for a new generation; without one (no operator, or no
  generation file: in-place restart off) it exits with the worker's status, so
  the pod fails and today's pod-level recovery takes over.

Every change is one ``kcover-pod:`` line on stdout (:mod:`kcover.podline`),
which the node agent reads from the container log — also a generation's first
step and each newer checkpoint the workers report (``kcover.checkpointed``),
from which the job's ETTR is counted (:mod:`kcover.k8s.progress`), and each
rank's compute seconds per step (``kcover.timed``) in batches, from which the
operator finds stragglers across pods.  The workers' own output
goes straight to the container log.  SIGTERM or SIGINT to ``kcover pod``
(the kubelet deleting the pod) stops the workers with the grace period and
exits 143; no worker outlives it.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from types import FrameType

from kcover.launcher.pod_files import DONE, STANDBY, read_generation, read_rank
from kcover.launcher.pod_inject import OrderFile, apply
from kcover.launcher.warm import DEFAULT_PRELOAD, WarmSpares
from kcover.launcher.workers import LaunchError, WorkerGroup, WorkerSpec, become_subreaper, start_worker, torchrun_env
from kcover.podline import MAX_GENERATION, MAX_TIMINGS, PodReport, PodState, PodTimings

TICK = 0.05
DEFAULT_GENERATION_FILE = Path("/etc/kcover/generation")
DEFAULT_MASTER_PORT = 29500
MAX_RANKS = 1_000_000
CHECKPOINT_REPORT_SECONDS = 5.0
"""A newer checkpoint is reported at most this often (a script may report one every step)."""
TIMING_REPORT_SECONDS = 5.0
"""A rank's timings wait at most this long for their batch to fill."""


class PodSpecError(ValueError):
    """A mistake in how the pod was set up (a missing or bad rank, world or address); the message names it."""


@dataclass(frozen=True)
class PodSpec:
    """Where this pod stands in the job, and how it restarts its workers."""

    command: tuple[str, ...]
    nnodes: int
    node_rank: int
    nproc_per_node: int = 1
    master_addr: str = "127.0.0.1"
    master_port: int = DEFAULT_MASTER_PORT
    port_span: int = 2
    generation_file: Path | None = DEFAULT_GENERATION_FILE
    grace_period: float = 10.0
    order_wait: float = 120.0
    restart_grace: float = 2.0
    """SIGTERM → SIGKILL when stopping workers for a new generation: their memory snapshot survives in the pod,
    and a rank blocked in a collective cannot run a SIGTERM handler anyway (measured: a full grace wasted)."""
    warm: bool = True
    preload: str = DEFAULT_PRELOAD
    assigned_rank: bool = False
    """The operator assigns this pod's rank (``rank`` beside the generation file); ``node_rank`` is -1 until then."""

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node

    @property
    def rank_file(self) -> Path | None:
        if not self.assigned_rank or self.generation_file is None:
            return None
        return self.generation_file.parent / "rank"

    def port(self, generation: int) -> int:
        """The rendezvous port of a generation: consecutive generations never share one."""
        return self.master_port + generation % self.port_span


def _first(env: Mapping[str, str], names: tuple[str, ...]) -> tuple[str, str] | None:
    for name in names:
        value = env.get(name)
        if value not in (None, ""):
            return name, str(value)
    return None


def _whole(what: str, source: str, text: str, low: int, high: int) -> int:
    """``text`` as a whole number in ``[low, high]``; the error names ``what`` and, for a variable, its ``source``."""
    named = f"{what} (from {source})" if source else what
    try:
        value = int(text)
    except ValueError:
        raise PodSpecError(f"{named} must be a whole number (got {text[:80]!r})") from None
    if not low <= value <= high:
        raise PodSpecError(f"{named} must be from {low} to {high} (got {value})")
    return value


NODE_RANK_VARIABLES = ("KCOVER_NODE_RANK", "PET_NODE_RANK", "JOB_COMPLETION_INDEX", "RANK")
NNODES_VARIABLES = ("KCOVER_NNODES", "PET_NNODES", "WORLD_SIZE")


def pod_spec(command: tuple[str, ...], env: Mapping[str, str], *, nproc_per_node: int = 1,
             nnodes: int | None = None, node_rank: int | None = None, master_addr: str | None = None,
             master_port: int | None = None, port_span: int = 2, generation_file: Path | None = None,
             grace_period: float = 10.0, order_wait: float = 120.0, restart_grace: float = 2.0,
             warm: bool = True, preload: str = DEFAULT_PRELOAD, assigned_rank: bool = False) -> PodSpec:
    """The pod's spec from options, falling back on the job's environment; :class:`PodSpecError` names a gap."""
    if not command:
        raise PodSpecError("no command given: kcover pod [OPTIONS] -- COMMAND [ARGS…]")
    _whole("--nproc-per-node", "", str(nproc_per_node), 1, 4096)
    _whole("--port-span", "", str(port_span), 1, 1000)
    for name, seconds in (("--grace-period", grace_period), ("--order-wait", order_wait),
                          ("--restart-grace", restart_grace)):
        if not (math.isfinite(seconds) and 0 <= seconds <= 86400):
            raise PodSpecError(f"{name} must be a number of seconds from 0 to 86400 (got {seconds:g})")
    if nnodes is None:
        found = _first(env, NNODES_VARIABLES)
        if found is None:
            raise PodSpecError("how many pods does the job have? Give --nnodes or set one of "
                               + ", ".join(NNODES_VARIABLES))
        nnodes = _whole("the number of pods", found[0], found[1], 1, MAX_RANKS)
    _whole("--nnodes", "", str(nnodes), 1, MAX_RANKS)
    if assigned_rank:
        node_rank = -1  # the operator's to say (the pod's index, if any, is no rank: pods outnumber ranks)
    elif node_rank is None:
        found = _first(env, NODE_RANK_VARIABLES)
        if found is None:
            raise PodSpecError("which pod of the job is this? Give --node-rank or set one of "
                               + ", ".join(NODE_RANK_VARIABLES) + " (an Indexed Job sets JOB_COMPLETION_INDEX)")
        node_rank = _whole("the pod's rank", found[0], found[1], 0, MAX_RANKS)
    if not assigned_rank and not 0 <= node_rank < nnodes:
        raise PodSpecError(f"the pod's rank must be from 0 to {nnodes - 1} for {nnodes} pods (got {node_rank})")
    address = master_addr or env.get("MASTER_ADDR") or ""
    if not address:
        if nnodes > 1:
            raise PodSpecError("where do the ranks meet? Give --master-addr or set MASTER_ADDR (the first pod's "
                               "address, e.g. a headless Service name)")
        address = "127.0.0.1"
    if master_port is None:
        text = env.get("MASTER_PORT")
        master_port = _whole("the rendezvous port", "MASTER_PORT", text, 1, 65535) if text else DEFAULT_MASTER_PORT
    if not 1 <= master_port <= 65535 - port_span + 1:
        raise PodSpecError(f"--master-port must leave room for --port-span {port_span} below 65536 "
                           f"(got {master_port})")
    return PodSpec(command, nnodes, node_rank, nproc_per_node, address, master_port, port_span,
                   DEFAULT_GENERATION_FILE if generation_file is None else generation_file, grace_period,
                   order_wait, restart_grace, warm, preload, assigned_rank)


def exit_status(code: int) -> int:
    """A worker's exit as a shell reports it (a signal N as 128 + N)."""
    return 128 - code if code < 0 else code


class PodSupervisor:
    """Runs one pod's workers, generation after generation (see the module docstring)."""

    def __init__(self, spec: PodSpec, say: Callable[[str], None] | None = None,
                 env: Mapping[str, str] | None = None) -> None:
        self.spec = spec
        self.say = say or _print
        self.env = dict(os.environ if env is None else env)
        self.stop_signal: int | None = None
        self.generation = 0
        self.in_place = False
        self.step: int | None = None
        self.stepped = False
        self.computing = False
        """A rank of this generation sent a step's timing (a DDP job times itself even without the SDK)."""
        self.said_first = False
        self.checkpoint: int | None = None
        """The newest complete checkpoint of this generation (``kcover.checkpointed``), and when it came."""
        self.checkpoint_at: float | None = None
        self.said_checkpoint: int | None = None
        self.said_checkpoint_at = -math.inf
        self.timings: dict[int, dict[int, float]] = {}
        """Each rank's compute seconds per step not yet said (the straggler detector's input, on the operator)."""
        self.timings_since: dict[int, float] = {}
        self.began = 0.0
        self.warned_bad_file = False
        self.warm = WarmSpares(spec.command, spec.preload) if spec.warm else None
        self.orders = OrderFile.beside(spec.generation_file)  # ``kcover inject``'s rehearsed faults

    def run(self) -> int:
        """Supervise until the workers succeed (0), fail with no restart order (their status) or kcover is
        stopped (143); whatever ends it, no worker is left running."""
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            become_subreaper()
            return self._run()
        finally:
            if self.warm is not None:
                self.warm.close()
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _run(self) -> int:
        if self.spec.assigned_rank:
            ended = self._stand_by()
            if ended is not None:
                return ended
        first = read_generation(self.spec.generation_file)
        self.in_place = first is not None
        self.generation = first or 0
        reason = "" if self.in_place else f"no order file {self.spec.generation_file}"
        while True:
            group = self._start(reason)
            try:
                ended = self._watch(group)
            finally:
                group.stop(self.spec.grace_period)
                group.close()
            if ended is not None:
                return ended
            reason = ""

    def _stand_by(self) -> int | None:
        """A pod without a rank yet waits, warm: None once the operator assigned one (``self.spec`` has it), 0
        when it says the job is done, 143 when kcover pod is stopped."""
        path = self.spec.rank_file
        assert path is not None
        said = warned = False
        while True:
            if self.stop_signal is not None:
                self._report(PodState.STOPPED, reason=f"standby: kcover pod received "
                                                      f"{signal.Signals(self.stop_signal).name}")
                return 128 + signal.SIGTERM
            order = read_rank(path, self.spec.nnodes)
            if isinstance(order, int):
                self.spec = replace(self.spec, node_rank=order)
                return None
            if order == DONE:
                self._report(PodState.DONE, reason="standby released: the job is done")
                return 0
            if order is None and not warned:
                warned = True
                print(f"kcover pod: {path} names no rank from 0 to {self.spec.nnodes - 1}, nor {STANDBY} or "
                      f"{DONE}: waiting as a standby", file=sys.stderr, flush=True)
            if not said:
                said = True
                self.generation = read_generation(self.spec.generation_file) or 0
                self._report(PodState.STANDBY, reason=f"waiting for a rank in {path}")
                if self.warm is not None and self.warm.enabled:
                    self.warm.spawn(self._specs(self.generation, node_rank=0))
            time.sleep(TICK)

    def _specs(self, generation: int, node_rank: int | None = None) -> list[WorkerSpec]:
        """The pod's workers for a generation: the variables ``torchrun`` sets, plus ``KCOVER_*`` (``node_rank``:
        another than the pod's, for the warm workers of a standby)."""
        spec = self.spec if node_rank is None else replace(self.spec, node_rank=node_rank)
        node = self.env.get("NODE_NAME") or socket.gethostname()
        specs = []
        for local in range(spec.nproc_per_node):
            rank = spec.node_rank * spec.nproc_per_node + local
            env = {**self.env, **torchrun_env(rank, local, spec.world_size, spec.nproc_per_node, spec.node_rank,
                                               spec.master_addr, spec.port(generation), generation, MAX_GENERATION,
                                               f"kcover-generation-{generation}")}
            env.update({"KCOVER_RANK": str(rank), "KCOVER_GENERATION": str(generation), "KCOVER_NODE": node})
            specs.append(WorkerSpec(rank, local, node, spec.node_rank, spec.command, env))
        return specs

    def _start(self, reason: str) -> WorkerGroup:
        spec, generation = self.spec, self.generation
        group = WorkerGroup([])
        warm = 0
        for worker_spec in self._specs(generation):
            worker = self.warm.take(worker_spec) if self.warm is not None else None
            warm += worker is not None
            try:
                group.workers.append(worker or start_worker(worker_spec, capture_output=False))
            except LaunchError:
                group.stop(0)
                group.close()
                raise
        self.began, self.stepped, self.computing, self.said_first = time.monotonic(), False, False, False
        self.checkpoint = self.checkpoint_at = self.said_checkpoint = None
        self.timings.clear()
        first_rank = spec.node_rank * spec.nproc_per_node
        last = first_rank + spec.nproc_per_node - 1
        ranks = str(first_rank) if last == first_rank else f"{first_rank}-{last}"
        started = f", {warm} warm" if warm else ""
        self._report(PodState.RUNNING, in_place=self.in_place,
                     reason=f"ranks {ranks} of {spec.world_size}, port {spec.port(generation)}{started}"
                     + (f"; in-place restart off: {reason}" if reason else ""))
        return group

    def _watch(self, group: WorkerGroup) -> int | None:
        """Until this generation ends: None to start the next one, else kcover's exit status."""
        while True:
            self._read_progress(group)
            self._say_progress()
            for order in self.orders.new():
                apply(order, group.workers)
            for worker in group.poll():
                if worker.exit_code not in (0, None):
                    assert worker.exit_code is not None
                    return self._failed(group, worker.rank, worker.exit_code)
            if not group.running:
                self._read_progress(group)
                self._say_progress(ending=True)
                self._report(PodState.DONE)
                return 0
            if self.stop_signal is not None:
                self._report(PodState.STOPPED, reason=f"kcover pod received {signal.Signals(self.stop_signal).name}")
                return 128 + signal.SIGTERM
            ordered = self._ordered()
            if ordered is not None:
                self._stop_for(group, ordered)
                return None
            if self.in_place and self.warm is not None and self.warm.due(self.began, self.stepped or self.computing,
                                                                              time.monotonic()):
                self.warm.spawn(self._specs(self.generation + 1))
            time.sleep(TICK)

    def _failed(self, group: WorkerGroup, rank: int, code: int) -> int | None:
        """A worker failed: stop the rest, report, wait for an order; None when one came."""
        group.stop(self.spec.restart_grace if self.in_place else self.spec.grace_period)
        self._read_progress(group)
        self._say_progress(ending=True)
        self._report(PodState.FAILED, rank=rank, exit=code)
        if not self.in_place:
            return exit_status(code)
        deadline = time.monotonic() + self.spec.order_wait
        while time.monotonic() < deadline:
            if self.stop_signal is not None:
                return 128 + signal.SIGTERM
            ordered = self._ordered()
            if ordered is not None:
                self.generation = ordered
                return None
            time.sleep(TICK)
        self._report(PodState.STOPPED, reason=f"no restart order in {self.spec.order_wait:g}s: exiting with the "
                                              f"worker's status {exit_status(code)}")
        return exit_status(code)

    def _stop_for(self, group: WorkerGroup, ordered: int) -> None:
        seconds = group.stop(self.spec.restart_grace)
        self._read_progress(group)
        self._say_progress(ending=True)
        self._report(PodState.STOPPED, reason=f"order for generation {ordered}, workers stopped in {seconds:.2f}s")
        self.generation = ordered

    def _ordered(self) -> int | None:
        """A newer generation than this one, when the operator ordered it."""
        if not self.in_place:
            return None
        ordered = read_generation(self.spec.generation_file)
        if ordered is None:
            if not self.warned_bad_file:
                self.warned_bad_file = True
                print(f"kcover pod: cannot read a generation in {self.spec.generation_file}; keeping "
                      f"generation {self.generation}", file=sys.stderr, flush=True)
            return None
        return ordered if ordered > self.generation else None

    def _read_progress(self, group: WorkerGroup) -> None:
        """The newest step and checkpoint the workers reported through the SDK (read, never blocking)."""
        for worker in group.workers:
            with contextlib.suppress(BlockingIOError, OSError):
                while chunk := os.read(worker.progress_read, 65536):
                    for line in chunk.split(b"\n"):
                        self._progress_line(worker.rank, line.split())

    def _progress_line(self, rank: int, parts: list[bytes]) -> None:
        if len(parts) == 3 and parts[0] == b"time":
            self._timed(rank, parts[1], parts[2])
            return
        number = parts[-1] if len(parts) == 1 or (len(parts) == 2 and parts[0] == b"ckpt") else b""
        if not number.isdigit() or len(number) > 15:
            return  # noise: not a step, a checkpoint or a timing
        step = int(number)
        self.step = max(self.step or 0, step)
        self.stepped = True
        if len(parts) == 2 and step > (self.checkpoint or -1):
            self.checkpoint, self.checkpoint_at = step, time.time()

    def _timed(self, rank: int, step_text: bytes, seconds_text: bytes) -> None:
        """A rank's compute seconds of a step (``kcover.timed``), kept until its batch is said."""
        try:
            step, seconds = int(step_text), float(seconds_text)
        except ValueError:
            return
        if not (0 <= step <= 10**15 and 0 < seconds < 1e6):
            return
        self.computing = True
        pending = self.timings.setdefault(rank, {})
        if not pending:
            self.timings_since[rank] = time.monotonic()
        pending[step] = seconds
        while len(pending) > 2 * MAX_TIMINGS:  # timings faster than their batches are said: keep the newest come
            del pending[next(iter(pending))]

    def _say_timings(self, ending: bool) -> None:
        """At most one batch per rank per tick: a full one, one pending for :data:`TIMING_REPORT_SECONDS`, or
        every pending one as the generation ends."""
        now = time.monotonic()
        for rank, pending in self.timings.items():
            while pending and (ending or len(pending) >= MAX_TIMINGS
                               or now - self.timings_since[rank] >= TIMING_REPORT_SECONDS):
                first = min(pending)
                steps = [s for s in range(first, first + MAX_TIMINGS) if s in pending]
                seconds = [pending.get(s) for s in range(first, steps[-1] + 1)]
                for step in steps:
                    del pending[step]
                self.say(PodTimings(self.generation, rank, first, tuple(seconds)).line())
                self.timings_since[rank] = now
                if not ending:
                    break

    def _say_progress(self, ending: bool = False) -> None:
        """Repeat the running line when the generation's first step came, and (at most every
        :data:`CHECKPOINT_REPORT_SECONDS`, or as the generation ends) when a newer checkpoint is complete: the
        run's productive time."""
        if self.stepped and not self.said_first:
            self.said_first = True
            self._report(PodState.RUNNING, step=self.step, at=time.time())
        now = time.monotonic()
        if (self.checkpoint is not None and self.checkpoint != self.said_checkpoint
                and (ending or now - self.said_checkpoint_at >= CHECKPOINT_REPORT_SECONDS)):
            self.said_checkpoint, self.said_checkpoint_at = self.checkpoint, now
            self._report(PodState.RUNNING, checkpoint=self.checkpoint, at=self.checkpoint_at)
        self._say_timings(ending)

    def _report(self, state: PodState, *, rank: int | None = None, exit: int | None = None, reason: str = "",
                in_place: bool = True, step: int | None = None, checkpoint: int | None = None,
                at: float | None = None) -> None:
        if state in (PodState.FAILED, PodState.STOPPED):
            step = self.step
        self.say(PodReport(self.generation, state, in_place=in_place, rank=rank, exit=exit, step=step,
                           checkpoint=checkpoint, at=at, reason=reason).line())

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self.stop_signal = signum


def _print(line: str) -> None:
    print(line, flush=True)
