"""Fault injection for testing recovery on a real job (``--inject`` or ``KCOVER_INJECT``).

A spec is ``KIND@TARGET[:WHEN]``, several joined by ``,``:

- KIND: ``xid79`` (GPU fell off the bus: an Xid line in the node's kernel log,
  then the rank is killed), ``xid48`` (double-bit ECC, likewise), ``oom`` (kernel
  OOM-killer line, then SIGKILL), ``crash`` (SIGKILL), ``hang`` (SIGSTOP: the rank
  freezes and every other rank blocks in its next collective);
- TARGET: ``rank3`` or ``node-1`` (the first rank on that node);
- WHEN: ``step=N`` (once the target reported step N) or ``after=S`` (seconds
  into the attempt); default ``after=0``.

Hardware faults (``xid*``) stay with their node: they fire in every attempt that
uses it, as a broken GPU would.  The others fire once, in the first attempt.
The launcher plays them from outside the worker, so the training script runs
unchanged: the attempt asks its :class:`Injector` once per watch tick which
injections are due (:meth:`Injector.due`), says so, records the kernel line
where there is one, then :meth:`Shot.fire` sends the signal.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from kcover.launcher.workers import Worker


class InjectError(ValueError):
    """An injection spec that cannot be understood; the message names it."""


class InjectKind(StrEnum):
    XID79 = "xid79"
    XID48 = "xid48"
    OOM = "oom"
    CRASH = "crash"
    HANG = "hang"


HARDWARE = frozenset({InjectKind.XID79, InjectKind.XID48})

_SPEC = re.compile(
    r"^(?P<kind>[a-z0-9]+)@(?P<target>rank\d+|node-[A-Za-z0-9]+)(?::(?P<when>step|after)=(?P<value>\d+(?:\.\d+)?))?$"
)


@dataclass(frozen=True)
class Injection:
    kind: InjectKind
    target: str
    when: str = "after"
    value: float = 0.0

    @property
    def sticky(self) -> bool:
        """Fires in every attempt on its node (hardware), not just once."""
        return self.kind in HARDWARE


def parse_injections(text: str) -> list[Injection]:
    """Parse ``KIND@TARGET[:WHEN]`` specs separated by commas."""
    injections = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        match = _SPEC.match(part)
        if not match:
            raise InjectError(
                f"bad injection {part!r}: expected KIND@TARGET[:step=N|:after=S], e.g. xid79@node-1:step=10"
            )
        try:
            kind = InjectKind(match["kind"])
        except ValueError:
            known = ", ".join(k.value for k in InjectKind)
            raise InjectError(f"bad injection {part!r}: unknown kind {match['kind']!r} (known: {known})") from None
        injections.append(Injection(kind, match["target"], match["when"] or "after", float(match["value"] or 0)))
    return injections


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
        return self.injection.kind is not InjectKind.HANG

    def fire(self) -> None:
        """Freeze (``hang``: SIGSTOP) or kill (SIGKILL) the worker's process group."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.worker.pid, signal.SIGKILL if self.kills else signal.SIGSTOP)


@dataclass
class Injector:
    """The run's injections and which have fired: one per run, asked once per watch tick."""

    injections: Sequence[Injection]
    fired: set[tuple[Injection, int]] = field(default_factory=set)

    def due(self, attempt: int, workers: Sequence[Worker], steps: Mapping[int, int], elapsed: float) -> list[Shot]:
        """The injections to fire now (marked fired): their target runs and reached the step or time."""
        shots = []
        for injection in self.injections:
            key = (injection, attempt if injection.sticky else 0)
            worker = _target(workers, injection.target)
            if key in self.fired or worker is None or worker.exit_code is not None:
                continue
            progress = steps.get(worker.rank, -1) if injection.when == "step" else elapsed
            if progress < injection.value:
                continue
            self.fired.add(key)
            shots.append(Shot(injection, worker))
        return shots


def _target(workers: Sequence[Worker], target: str) -> Worker | None:
    return next((w for w in workers if target in (f"rank{w.rank}", w.node)), None)
