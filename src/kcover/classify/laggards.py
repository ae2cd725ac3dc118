"""Which rank a collective timeout waited for: the laggard of a hang.

When a job hangs, every rank that reached the stuck collective times out in
it and logs so, while the rank everybody waited for often logs nothing at all
(it is stuck in Python: a data loader, a checkpoint save on rank 0, another
process group's barrier).  Blaming the ranks that logged is the classic
mistake; this module reads the numbers PyTorch's ``ProcessGroupNCCL`` puts in
those lines to find the rank that did *not* arrive, as its flight-recorder
analysis does:

- ``WorkNCCL(SeqNum=S, …) ran for … before timing out``, ``Timeout at NCCL
  work: S``, ``detected by watchdog at work: S`` / ``at work sequence id: S``:
  this rank waits in collective ``S`` of its process group;
- ``last enqueued NCCL work: E`` (also in ``Received a dump signal … Last
  enqueued NCCL work: E``, logged by a rank that was told to dump because
  another timed out): this rank issued collectives up to ``E``;
- ``Ranks 1, 3 failed to pass monitoredBarrier``: ``monitored_barrier`` names
  the ranks itself (the other ranks' ``… while waiting for send/recv from rank
  0`` names the barrier's coordinator, not a laggard).

Within one process group (``[PG ID 2 …]``, ``[PG 2 …]``; lines without one
belong to the default group) the stuck collective is the lowest ``S`` any rank
waits in.  Every collective before it completed on every rank, so a rank that
issued exactly ``S - 1`` and no more never reached it: a laggard, *proved* by
its own numbers, when such ranks are no more than those waiting (one rank ahead
of all the others issued a collective nobody else did: no laggard is named).
A rank whose last work was a point-to-point one counts on another counter
(PyTorch numbers sends and receives apart) and matches no ``S - 1`` by chance
but rarely.  Without such numbers, ranks whose log
was read (per-rank files, ``kcover run``'s workers) but that show no sign of
waiting while others timed out are *suspects*: a rank killed before its own
watchdog fired looks the same, so they are named as such and never excluded.
Pure computation, no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from kcover.faults import NO_PROGRESS_RULE, Category, Fault

_GROUP = re.compile(r"\[PG (?:ID )?(\d+)\b")
_WAITING = re.compile(
    r"WorkNCCL\(SeqNum=(\d+)|Timeout at NCCL work: (\d+)|detected by watchdog at work(?: sequence id)?: (\d+)"
)
_ENQUEUED = re.compile(r"[Ll]ast enqueued (?:NCCL )?work: (\d+)")
_BARRIER_FAILED = re.compile(r"\bRanks? ([\d, ]{1,2000}?) failed to pass monitoredBarrier")
_IN_TEXT_RANK = re.compile(r"\bRank (\d+)\]")
READ_CHARS = 4000
MAX_RANK = 1 << 20
"""Numbers above this are no rank (a line cut mid-number, a step count)."""


@dataclass(frozen=True)
class Progress:
    """What one line of a rank timing out says about its place in its process group's collectives."""

    rank: int | None
    group: int | None
    waiting: int | None = None
    """The collective (sequence number) this rank timed out in."""
    enqueued: int | None = None
    """The last collective this rank issued."""
    named: tuple[int, ...] = ()
    """Ranks ``monitored_barrier`` named as not arriving."""
    node: str | None = None


@dataclass(frozen=True)
class Laggards:
    """The ranks a hang waited for, and how sure that is."""

    ranks: tuple[int, ...]
    waiting: tuple[int, ...]
    """The ranks seen waiting for them."""
    collective: int | None
    how: Literal["barrier", "numbers", "silent"]
    """Named by ``monitored_barrier``, proved by their own numbers, or suspects (no sign of waiting)."""
    nodes: tuple[str, ...] = ()

    def describe(self) -> str:
        who = _ranks_text(self.ranks) + (f" on {', '.join(self.nodes)}" if self.nodes else "")
        where = f"collective {self.collective}" if self.collective is not None else "the collective"
        waiting = _ranks_text(self.waiting) if 0 < len(self.waiting) <= 4 else f"{len(self.waiting)} ranks"
        they, pronoun = ("it was", "it") if len(self.ranks) == 1 else ("they were", "they")
        if self.how == "barrier":
            return f"monitored_barrier named {who} as never arriving: look at what {they} doing"
        if self.how == "numbers":
            return f"{who} never reached {where}, in which {waiting} waited: look at what {they} doing"
        waited = f"in {where}" if self.collective is not None else f"for {'it' if len(self.ranks) == 1 else 'them'}"
        return (f"{who} did not time out while {waiting} timed out waiting {waited}: "
                f"the likely laggard (or killed before {pronoun} timed out too)")


def _ranks_text(ranks: Sequence[int]) -> str:
    shown = ", ".join(str(rank) for rank in ranks[:8]) + (f" and {len(ranks) - 8} more" if len(ranks) > 8 else "")
    return f"rank{'s' if len(ranks) != 1 else ''} {shown}"


def progress_of(text: str, rank: int | None, node: str | None = None, *, rank_in_text: bool | None = None,
                source_rank: int | None = None) -> Progress:
    """What a timeout line says about its rank's progress (the numbers it gives, if any).

    In a process group other than the default, the rank a line's words name
    (``[PG ID 2 … Rank 1]``) is the rank within that group, not the job's:
    then the rank of the line's log (``source_rank``) is taken, or none.
    ``rank_in_text``: whether ``rank`` was read from the words (None: not
    known, so a rank equal to the one the words name is taken for it).  Only
    the line's first :data:`READ_CHARS` are read: the numbers sit near its head.
    """
    text = text[:READ_CHARS]
    waiting = _WAITING.search(text)
    enqueued = _ENQUEUED.search(text)
    failed = _BARRIER_FAILED.search(text)
    found_group = _GROUP.search(text)
    group = int(found_group.group(1)) if found_group else None
    named: tuple[int, ...] = ()
    if failed:
        named = tuple(int(number) for number in re.findall(r"\d+", failed.group(1)) if int(number) <= MAX_RANK)
    if group and rank is not None:
        if rank_in_text is None:
            in_text = _IN_TEXT_RANK.search(text)
            rank_in_text = in_text is not None and int(in_text.group(1)) == rank
        if rank_in_text:
            rank = source_rank
    return Progress(
        rank=rank,
        group=group,
        waiting=int(next(number for number in waiting.groups() if number)) if waiting else None,
        enqueued=int(enqueued.group(1)) if enqueued else None,
        named=named,
        node=node,
    )


def tells_progress(fault: Fault) -> bool:
    """Whether a fault is a rank timing out while it waited for others (not kcover's own no-progress watch)."""
    return fault.category is Category.COLLECTIVE_TIMEOUT_HANG and fault.rule != NO_PROGRESS_RULE


def progress_of_faults(faults: Iterable[Fault]) -> list[Progress]:
    """The progress told by the evidence of every fault of a rank timing out."""
    return [progress_of(fault.evidence.line, fault.rank, fault.node) for fault in faults if tells_progress(fault)]


def find_laggards(progress: Sequence[Progress], read_ranks: dict[int, str | None] | None = None) -> Laggards | None:
    """The ranks a hang waited for, from what timeout lines tell; None when they do not tell.

    ``read_ranks``: ranks whose whole log was read (rank → node), for suspects
    that logged nothing; without it only proved laggards are found.
    """
    nodes = {p.rank: p.node for p in progress if p.rank is not None and p.node}
    named = sorted({rank for p in progress for rank in p.named})
    waiting_ranks = sorted({p.rank for p in progress if p.rank is not None})
    if named:
        return Laggards(tuple(named), tuple(r for r in waiting_ranks if r not in named), None, "barrier",
                        _nodes_of(named, nodes, read_ranks))
    behind, waiters, collective = _behind(progress)
    if behind:
        return Laggards(tuple(behind), tuple(waiters), collective, "numbers", _nodes_of(behind, nodes, read_ranks))
    if not read_ranks or len(waiting_ranks) < 2:
        return None
    silent = sorted(rank for rank in read_ranks if rank not in waiting_ranks)
    if not silent or len(silent) >= len(waiting_ranks):
        return None
    collectives = {p.waiting for p in progress if p.waiting is not None}
    return Laggards(tuple(silent), tuple(waiting_ranks), min(collectives) if len(collectives) == 1 else None,
                    "silent", _nodes_of(silent, nodes, read_ranks))


def _behind(progress: Sequence[Progress]) -> tuple[list[int], list[int], int | None]:
    """Ranks that issued all collectives up to the one their group is stuck in, not it (the first group with any)."""
    reached: dict[tuple[int | None, int], int] = {}
    stuck: dict[int | None, int] = {}
    for p in progress:
        if p.rank is None:
            continue
        if p.waiting is not None:
            stuck[p.group] = min(stuck.get(p.group, p.waiting), p.waiting)
        furthest = max(number for number in (p.waiting, p.enqueued) if number is not None) if (
            p.waiting is not None or p.enqueued is not None) else None
        if furthest is not None:
            key = (p.group, p.rank)
            reached[key] = max(reached.get(key, furthest), furthest)
    for group, collective in sorted(stuck.items(), key=lambda item: (item[0] is None, item[0] or 0)):
        behind = sorted(rank for (of, rank), number in reached.items() if of == group and number == collective - 1)
        there = sorted(rank for (of, rank), number in reached.items() if of == group and number >= collective)
        if behind and len(behind) <= len(there):  # at or past it: waiting in it
            return behind, there, collective
    return [], [], None


def _nodes_of(ranks: Iterable[int], nodes: dict[int, str], read_ranks: dict[int, str | None] | None) -> tuple[str, ...]:
    found: list[str] = []
    for rank in ranks:
        node = nodes.get(rank) or (read_ranks or {}).get(rank)
        if node and node not in found:
            found.append(node)
    return tuple(found)
