"""The node's kernel faults: each occurrence reported once, to every pod it concerns.

A failing GPU repeats itself in the kernel log (an Xid flood is hundreds of
lines a second) and one report is wanted.  But a node is used again after
kcover releases it, and ``kcover inject`` may rehearse the same fault twice:
the same fault then is a new occurrence, and must reach the operator again (a
collector that remembered every fault for the agent's lifetime reported an Xid
79 on a node once, ever, and a job restarted onto the released node ran on
through the next one).  So:

- a fault (its rule and the shape of its line, digits masked) seen again within
  :data:`QUIET_SECONDS` of its last sighting is the same occurrence; after a
  quiet spell it is a new one, and the node is reported unhealthy again;
- each occurrence is told once to each pod on the node, including pods that
  started while it went on (a flood that outlives the pods it was reported to
  concerns their replacements too).

At most :data:`MAX_REMEMBERED` faults are remembered, the longest unseen
forgotten first (a forgotten one seen again is new: reported twice rather than
never).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from kcover.classify.collector import evidence_of, fault_from_rule
from kcover.classify.matcher import Hit
from kcover.collect.lines import line_shape
from kcover.collect.sources import SourceInfo
from kcover.faults import Fault

QUIET_SECONDS = 30.0
MAX_REMEMBERED = 1000


@dataclass
class Occurrence:
    """One occurrence of a kernel fault: its first line, when it was last seen, which pods were told."""

    fault: Fault
    seen: float
    told: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class Sighting:
    """What one kernel line asks of the agent."""

    fault: Fault
    new: bool  # a new occurrence: report the node
    tell: list[str]  # the pods (uids) to report it to


class KernelFaults:
    """The node's kernel-fault occurrences: when each was last seen, and whom it was told."""

    def __init__(self, quiet: float = QUIET_SECONDS, clock: Callable[[], float] = time.monotonic) -> None:
        self.quiet, self.clock = quiet, clock
        self._seen: dict[tuple[str, str], Occurrence] = {}  # oldest sighting first

    def add_hit(self, source: SourceInfo, hit: Hit, pods: Collection[str]) -> Sighting:
        """``hit`` seen in the kernel log while ``pods`` (uids) run on the node."""
        now = self.clock()
        key = (hit.rule.id, line_shape(hit.line.text))
        occurrence = self._seen.pop(key, None)
        new = occurrence is None or now - occurrence.seen > self.quiet
        if occurrence is None or new:  # (the first test only tells mypy what `new` already says)
            occurrence = Occurrence(fault_from_rule(hit.rule, evidence_of(source, hit)), now)
        occurrence.seen = now
        self._seen[key] = occurrence  # moved to the end: the most recently seen
        if len(self._seen) > MAX_REMEMBERED:
            del self._seen[next(iter(self._seen))]
        tell = [uid for uid in pods if uid not in occurrence.told]
        occurrence.told = occurrence.told.intersection(pods).union(tell)  # pods gone are forgotten
        return Sighting(occurrence.fault, new, tell)
