"""Rehearsed process faults in a pod that runs ``kcover pod``: ``kcover inject NS/JOB crash@rank1``.

``kcover inject`` creates a ``FaultInjection`` (an object only a cluster admin
may create); the kcover agent on the pod's node answers it by writing the
pod's annotation ``kcover.io/inject`` with one *order*, ``KIND@rankN#ID``
(``crash@rank1#3f2c…``: the kind, the pod's rank in the job, the request's id).
The kubelet projects that annotation into a second downward-API file beside
the generation file (``/etc/kcover/inject``), and ``kcover pod`` reads it
once per tick with :class:`OrderFile` and acts with :func:`apply`:

- ``crash``: SIGKILL to the pod's first running worker (its process group);
- ``hang``: SIGSTOP, so it freezes and the other ranks block in their next collective;
- ``oom``: the kernel OOM killer's line (with the worker's pid) on stdout, then SIGKILL,
  so the agent classifies it from the container log as ``host.oom-killer``,
  as ``kcover run --inject oom@…`` records it.

The signals are those of ``kcover run --inject`` (:class:`~kcover.launcher.inject.Shot`).
The file is read like the generation file: never blocking (a FIFO or a device
where it should be reads as nothing), at most :data:`MAX_ORDER` bytes, anything
that is not one well-formed order ignored.  Each order acts once: its id is
remembered, and an order already in the file when ``kcover pod`` starts is an
old one (the annotation outlives the container) and never acts.
"""

from __future__ import annotations

import os
import re
import stat
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from kcover.launcher.inject import Injection, InjectKind, Shot
from kcover.launcher.workers import Worker

MAX_ORDER = 256
PROCESS_KINDS = (InjectKind.CRASH, InjectKind.HANG, InjectKind.OOM)
ORDER_FILE_NAME = "inject"
_ORDER = re.compile(r"^(?P<kind>[a-z]+)@rank(?P<rank>\d{1,7})#(?P<id>[A-Za-z0-9-]{1,64})$")


@dataclass(frozen=True)
class Order:
    """One rehearsed fault for this pod: what, on which pod rank, and the request's id."""

    kind: InjectKind
    rank: int
    id: str

    def text(self) -> str:
        return f"{self.kind.value}@rank{self.rank}#{self.id}"


def parse_order(text: str) -> Order | None:
    """The order in ``text``, or None when it is not exactly one well-formed process order."""
    match = _ORDER.match(text.strip())
    if match is None or match["kind"] not in {kind.value for kind in PROCESS_KINDS}:
        return None
    return Order(InjectKind(match["kind"]), int(match["rank"]), match["id"])


def read_order(path: Path | None) -> Order | None:
    """The order in the file, never blocking; None when absent, not a regular file, unreadable or not an order."""
    if path is None:
        return None
    try:
        if not stat.S_ISREG(path.stat().st_mode):
            return None
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            data = os.read(descriptor, MAX_ORDER + 1)
        finally:
            os.close(descriptor)
    except OSError:
        return None
    if len(data) > MAX_ORDER:
        return None
    return parse_order(data.decode("ascii", "replace"))


class OrderFile:
    """The pod's order file: :meth:`new` returns each order once; one present at the start counts as seen."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.seen: set[str] = set()
        first = read_order(path)
        if first is not None:
            self.seen.add(first.id)

    @classmethod
    def beside(cls, generation_file: Path | None) -> OrderFile:
        """The order file next to the generation file (same downward-API volume); none without one."""
        return cls(generation_file.parent / ORDER_FILE_NAME if generation_file is not None else None)

    def new(self) -> list[Order]:
        order = read_order(self.path)
        if order is None or order.id in self.seen:
            return []
        self.seen.add(order.id)
        return [order]


def apply(order: Order, workers: Sequence[Worker], say: Callable[[str], None] | None = None) -> Worker | None:
    """Act on the first running worker of the order's pod rank; the worker hit, or None (said why)."""
    say = say or _print
    target = next((w for w in workers if w.spec.group_rank == order.rank and w.exit_code is None), None)
    if target is None:
        print(f"kcover pod: injection {order.text()} ignored: no running worker of pod rank {order.rank} here",
              file=sys.stderr, flush=True)
        return None
    shot = Shot(Injection(order.kind, f"rank{target.rank}"), target)
    line = shot.kernel_line
    if line is not None:
        say(line)
    print(f"kcover pod: injecting {order.kind.value} into rank {target.rank} (pid {target.pid}), request "
          f"{order.id}", file=sys.stderr, flush=True)
    shot.fire()
    return target


def _print(line: str) -> None:
    print(line, flush=True)
