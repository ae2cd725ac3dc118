"""Fault injection for testing recovery on a real job (``--inject`` or ``KCOVER_INJECT``).

A spec is ``KIND@TARGET[:WHEN][:factor=F]``, several joined by ``,``:

- KIND: ``xid79`` (GPU fell off the bus: an Xid line in the node's kernel log,
  then the rank is killed), ``xid48`` (double-bit ECC, likewise), ``oom`` (kernel
  OOM-killer line, then SIGKILL), ``crash`` (SIGKILL), ``hang`` (SIGSTOP: the rank
  freezes and every other rank blocks in its next collective), ``slow`` (a
  straggler: the rank runs ``factor`` times slower, by a SIGSTOP/SIGCONT duty
  cycle, :mod:`kcover.launcher.throttle`; ``factor=F`` is required, ``1 < F <= 100``);
- TARGET: ``rank3`` or ``node-1`` (the first rank on that node);
- WHEN: ``step=N`` (once the target reported step N) or ``after=S`` (seconds
  into the attempt); default ``after=0``.

Hardware faults (``xid*``) stay with their node: they fire in every attempt that
uses it, as a broken GPU would.  A ``slow`` node stays slow too: in later
attempts it throttles the same local rank of the node it first hit, if that node
is still in the job (a replaced node is not).  The others fire once, in the
first attempt.
The launcher plays them from outside the worker, so the training script runs
unchanged: the attempt asks its :class:`Injector` once per watch tick which
injections are due (:meth:`Injector.due`), says so, records the kernel line
where there is one, then :meth:`Shot.fire` sends the signal (or, for ``slow``,
starts and returns the :class:`~kcover.launcher.throttle.Throttle` that the
attempt stops before its workers).
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from kcover.launcher.throttle import Throttle
from kcover.launcher.workers import Worker


class InjectError(ValueError):
    """An injection spec that cannot be understood; the message names it."""


class InjectKind(StrEnum):
    XID79 = "xid79"
    XID48 = "xid48"
    OOM = "oom"
    CRASH = "crash"
    HANG = "hang"
    SLOW = "slow"


HARDWARE = frozenset({InjectKind.XID79, InjectKind.XID48})
STAYS_WITH_NODE = HARDWARE | {InjectKind.SLOW}
MAX_FACTOR = 100.0

_SPEC = re.compile(r"^(?P<kind>[a-z0-9]+)@(?P<target>rank\d+|node-[A-Za-z0-9]+)(?P<options>(?::[a-z]+=[^:]*)*)$")
_WHEN = re.compile(r"^\d+(?:\.\d+)?$")
_USAGE = "expected KIND@TARGET[:step=N|:after=S][:factor=F], e.g. xid79@node-1:step=10 or slow@rank3:factor=1.3"


@dataclass(frozen=True)
class Injection:
    kind: InjectKind
    target: str
    when: str = "after"
    value: float = 0.0
    factor: float | None = None
    """How many times slower a ``slow`` rank runs."""

    @property
    def sticky(self) -> bool:
        """Fires in every attempt on its node (hardware), not just once."""
        return self.kind in HARDWARE


def parse_injections(text: str) -> list[Injection]:
    """Parse ``KIND@TARGET[:WHEN][:factor=F]`` specs separated by commas."""
    return [_parse_one(part) for part in filter(None, (p.strip() for p in text.split(",")))]


def parse_kind(part: str, text: str, known: Sequence[InjectKind] = tuple(InjectKind)) -> InjectKind:
    """The kind named ``text`` in the spec ``part``, one of ``known``; :class:`InjectError` lists them."""
    if text in {kind.value for kind in known}:
        return InjectKind(text)
    names = ", ".join(k.value for k in known)
    raise InjectError(f"bad injection {part!r}: unknown kind {text!r} (known: {names})")


def _parse_one(part: str) -> Injection:
    match = _SPEC.match(part)
    if not match:
        raise InjectError(f"bad injection {part!r}: {_USAGE}")
    kind = parse_kind(part, match["kind"])
    options = dict(option.split("=", 1) for option in match["options"].split(":")[1:])
    unknown = set(options) - {"step", "after", "factor"}
    if unknown or ("step" in options and "after" in options) or len(match["options"].split(":")) - 1 != len(options):
        raise InjectError(f"bad injection {part!r}: {_USAGE}")
    when = "step" if "step" in options else "after"
    value = options.get(when, "0")
    if not _WHEN.match(value):
        raise InjectError(f"bad injection {part!r}: {when} must be a number from 0 (got {value!r})")
    return Injection(kind, match["target"], when, float(value), _factor(part, kind, options.get("factor")))


def _factor(part: str, kind: InjectKind, text: str | None) -> float | None:
    """The slowdown of a ``slow`` injection: required there, refused elsewhere, ``1 < F <= 100``."""
    if kind is not InjectKind.SLOW:
        if text is not None:
            raise InjectError(f"bad injection {part!r}: factor= is only for slow (e.g. slow@rank3:factor=1.3)")
        return None
    try:
        factor = float(text) if text is not None else math.nan
    except ValueError:
        factor = math.nan
    if not (math.isfinite(factor) and 1 < factor <= MAX_FACTOR):
        got = "nothing" if text is None else repr(text)
        raise InjectError(f"bad injection {part!r}: slow needs factor=F, a number greater than 1 and at most "
                          f"{MAX_FACTOR:g} (got {got})")
    return factor


def kernel_line(kind: InjectKind, pid: int) -> str | None:
    """The kernel message a real fault of this kind leaves, or None."""
    if kind is InjectKind.XID79:
        return f"NVRM: Xid (PCI:0000:3b:00): 79, pid={pid}, name=python, GPU has fallen off the bus."
    if kind is InjectKind.XID48:
        return (f"NVRM: Xid (PCI:0000:3b:00): 48, pid={pid}, name=python, An uncorrectable double bit error "
                "(DBE) has been detected on GPU in the framebuffer at partition 0, subpartition 0.")
    if kind is InjectKind.OOM:
        return (f"Out of memory: Killed process {pid} (python) total-vm:90000000kB, anon-rss:80000000kB, "
                "file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:160000kB oom_score_adj:0")
    return None


@dataclass(frozen=True)
class Shot:
    """One injection that is due now, on the worker it targets."""

    injection: Injection
    worker: Worker

    @property
    def kernel_line(self) -> str | None:
        """What the node's kernel log says about this fault, if anything."""
        return kernel_line(self.injection.kind, self.worker.pid)

    @property
    def kills(self) -> bool:
        """The worker dies of it (its exit is then the injection's doing, not a fault of its own)."""
        return self.injection.kind not in (InjectKind.HANG, InjectKind.SLOW)

    def fire(self) -> Throttle | None:
        """Freeze (``hang``: SIGSTOP), kill (SIGKILL) or throttle (``slow``) the worker's process group.

        Returns the started throttle of a ``slow`` injection: the caller must :meth:`~Throttle.stop` it.
        """
        if self.injection.kind is InjectKind.SLOW:
            assert self.injection.factor is not None
            return Throttle(self.worker.pid, self.injection.factor).start()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.worker.pid, signal.SIGKILL if self.kills else signal.SIGSTOP)
        return None


@dataclass
class Injector:
    """The run's injections and which have fired: one per run, asked once per watch tick."""

    injections: Sequence[Injection]
    fired: set[tuple[Injection, int]] = field(default_factory=set)
    slow_places: dict[Injection, tuple[str, int]] = field(default_factory=dict)
    """Where each ``slow`` injection first hit: (node, local rank); it stays there."""

    def due(self, attempt: int, workers: Sequence[Worker], steps: Mapping[int, int], elapsed: float) -> list[Shot]:
        """The injections to fire now (marked fired): their target runs and reached the step or time."""
        shots = []
        for injection in self.injections:
            sticky = injection.kind in STAYS_WITH_NODE
            key = (injection, attempt if sticky else 0)
            worker = self._target(injection, workers)
            if key in self.fired or worker is None or worker.exit_code is not None:
                continue
            progress = steps.get(worker.rank, -1) if injection.when == "step" else elapsed
            if progress < injection.value:
                continue
            self.fired.add(key)
            if injection.kind is InjectKind.SLOW:
                self.slow_places.setdefault(injection, (worker.node, worker.spec.local_rank))
            shots.append(Shot(injection, worker))
        return shots

    def _target(self, injection: Injection, workers: Sequence[Worker]) -> Worker | None:
        place = self.slow_places.get(injection)
        if place is None:
            return _target(workers, injection.target)
        return next((w for w in workers if (w.node, w.spec.local_rank) == place), None)


def _target(workers: Sequence[Worker], target: str) -> Worker | None:
    return next((w for w in workers if target in (f"rank{w.rank}", w.node)), None)
