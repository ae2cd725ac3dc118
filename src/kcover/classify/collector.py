"""Gathering hits into faults: deduplicated, counted, attributed to a rank and node.

A flood of identical lines (800,000 Xid lines is a real report) must not become
800,000 faults.  :class:`FaultCollector` keys each hit by source, rule and the
line with its digits masked; repeats only raise a counter.  Per source and rule
at most :data:`MAX_DISTINCT` distinct lines are kept, later ones are counted on
the last kept one, so memory stays bounded whatever the input.

Rank and node come from the line itself when it says (``[rank3]:``, an NCCL
host prefix) and otherwise from the source (a file named ``rank3.log`` in a
folder ``node-2/``, or the worker the launcher started).

The collector also keeps the last few kilobytes of each source
(:meth:`FaultCollector.keep_tail`), so a log that ends in an error no rule
names still yields a verdict (:mod:`kcover.classify.fallback`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import replace

from kcover.classify.fallback import TAIL_LINES, Tail, TailKeeper, lines_before
from kcover.classify.laggards import Progress, progress_of
from kcover.classify.matcher import Hit
from kcover.classify.rules import UNLESS_AFTER_LINES, Rule
from kcover.classify.vocabulary import layer_of
from kcover.collect.hostlist import expand as expand_hosts
from kcover.collect.lines import evidence_text, line_shape, parse_line
from kcover.collect.sources import SourceInfo
from kcover.faults import NO_PROGRESS_RULE, Category, Evidence, Fault, Severity

MAX_DISTINCT = 20
MAX_EXCUSED_REPEATS = 8
"""A fault seen more often than this is never excused: a flood is not one line logged on the way out."""
MAX_PROGRESS = 16384
"""Distinct collective-timeout progress reports kept (:mod:`kcover.classify.laggards`), per job."""


def fault_from_rule(rule: Rule, evidence: Evidence, count: int = 1) -> Fault:
    """A :class:`Fault` for ``rule`` seen as ``evidence``.

    A generic rule (``refine_by_words``) takes the category its line's words
    name, if they name one (:func:`~kcover.classify.vocabulary.layer_of`); the
    rest of the rule (retries, blame) stays.
    """
    spec = rule.spec
    words = parse_line(evidence.line.encode()).message if spec.refine_by_words else ""  # not a prefix's words
    category = (layer_of([words]) if words else None) or spec.category
    node_at_fault = spec.node_at_fault and (evidence.node is not None or not spec.only_named_node)
    title = spec.title if category is spec.category else f"{spec.title}; its words name {category.value}"
    return Fault(
        rule=spec.id,
        category=category,
        severity=spec.severity,
        retriable=spec.retriable,
        node_at_fault=node_at_fault,
        role=spec.role,
        priority=spec.priority,
        title=title,
        remediation=spec.remediation.strip(),
        evidence=evidence,
        count=count,
    )


def evidence_of(source: SourceInfo, hit: Hit, named: str | None = None) -> Evidence:
    """The evidence of one hit: the line (cut around the match), where it was, and its rank and node.

    The node is the source's.  A rule that blames only named nodes (a scheduler's report about
    another node) takes the node its line names (``named``, one of :func:`named_nodes`), or none.
    Other rules take the node the line names (``kubectl get nodes`` showing ``gpu-7  NotReady``)
    only for a source of no known node, a pasted log: a worker's log is the job's own text, and a
    line in it naming another node must not move that node's pods.
    """
    line = hit.line
    found = hit.rule.locate(line.message)[0]
    position = None if found is None else line.message_at + found  # confirmed on the line's message
    node = named if hit.rule.spec.only_named_node else source.node or named or line.node
    return Evidence(
        source=source.name,
        line=evidence_text(line.text, position),
        line_number=hit.line_number,
        timestamp=line.timestamp,
        rank=line.rank if line.rank is not None else source.rank,
        node=node,
    )


def named_nodes(hit: Hit) -> tuple[str | None, ...]:
    """The nodes a hit's line names: one, each of a host list's (``gpu-[01-02]``), or ``(None,)`` for none."""
    named = hit.rule.locate(hit.line.message)[1] if hit.rule.names_nodes else None
    return (expand_hosts(named) or (None,)) if named else (None,)


class FaultCollector:
    """Accumulates the faults of one job, in the order they were first seen."""

    def __init__(self) -> None:
        self._faults: dict[tuple[str, str, str], Fault] = {}
        self._counts: dict[tuple[str, str, str], int] = {}
        self._distinct: dict[tuple[str, str], int] = {}
        self._last_key: dict[tuple[str, str], tuple[str, str, str]] = {}
        self._tails: dict[SourceInfo, TailKeeper] = {}
        self._excusable: dict[tuple[str, str, str], Rule] = {}
        """The faults whose rule has ``unless_after`` lines, to check against the tail at the end."""
        self._seen_at: dict[tuple[str, str, str], list[int]] = {}
        """For those faults, the line number of every occurrence (each must be excused)."""
        self._degraded_at: dict[SourceInfo, deque[int]] = {}
        """Per source, the line numbers of its latest degraded signs (the fallback passes over them)."""
        self._progress: dict[Progress, None] = {}
        """What collective-timeout lines told of each rank (repeats of one shape would hide other ranks')."""
        self._changes = 0
        self._judged: tuple[int, dict[SourceInfo, Tail], set[tuple[str, str, str]]] | None = None
        """The tails and the excused faults as of ``_changes``: a verdict reads both, computed once."""

    def add_hit(self, source: SourceInfo, hit: Hit) -> Fault | None:
        """Record one hit; returns the new fault (the last, for a line naming several nodes), or
        ``None`` when it only raised a count."""
        self._changes += 1
        shape = line_shape(hit.line.text)
        if hit.rule.spec.severity is not Severity.FATAL:
            numbers = self._degraded_at.get(source)
            if numbers is None:
                numbers = self._degraded_at[source] = deque(maxlen=TAIL_LINES)
            numbers.append(hit.line_number)
        if (hit.rule.spec.category is Category.COLLECTIVE_TIMEOUT_HANG and hit.rule.id != NO_PROGRESS_RULE
                and len(self._progress) < MAX_PROGRESS):
            rank = hit.line.rank if hit.line.rank is not None else source.rank
            told = progress_of(hit.line.text, rank, source.node or hit.line.node,
                               rank_in_text=hit.line.rank_in_text, source_rank=source.rank)
            self._progress[told] = None
        if not hit.rule.names_nodes:
            return self._add_shaped(source, hit, shape, None)
        new = None
        for named in named_nodes(hit):  # lines alike but for the node they name are different faults
            new = self._add_shaped(source, hit, shape + "\0" + (named or ""), named) or new
        return new

    def _add_shaped(self, source: SourceInfo, hit: Hit, shape: str, named: str | None) -> Fault | None:
        key = (source.name, hit.rule.id, shape)
        if key in self._counts:
            self._counts[key] += 1
            self._note_seen(key, hit.line_number)
            return None
        return self.add(hit.rule, evidence_of(source, hit, named), shape)

    def add(self, rule: Rule, evidence: Evidence, shape: str | None = None) -> Fault | None:
        """Record a fault seen as ``evidence``; repeats of the same shape are counted."""
        self._changes += 1
        group = (evidence.source, rule.id)
        key = (evidence.source, rule.id, shape if shape is not None else evidence.line)
        if key not in self._counts and self._distinct.get(group, 0) >= MAX_DISTINCT:
            key = self._last_key[group]
        if key in self._counts:
            self._counts[key] += 1
            self._note_seen(key, evidence.line_number)
            return None
        fault = fault_from_rule(rule, evidence)
        self._faults[key] = fault
        if rule.unless_after:
            self._excusable[key] = rule
            self._seen_at[key] = []
            self._note_seen(key, evidence.line_number)
        self._counts[key] = 1
        self._distinct[group] = self._distinct.get(group, 0) + 1
        self._last_key[group] = key
        return fault

    def _note_seen(self, key: tuple[str, str, str], line_number: int | None) -> None:
        seen = self._seen_at.get(key)
        if seen is not None and line_number is not None and len(seen) <= MAX_EXCUSED_REPEATS:
            seen.append(line_number)

    def keep_tail(self, source: SourceInfo, block: bytes, lines: int) -> None:
        """Remember the end of ``source`` after one more cleaned block (``lines``: line breaks read so far)."""
        self._changes += 1
        keeper = self._tails.get(source)
        if keeper is None:
            keeper = self._tails[source] = TailKeeper()
        keeper.add(block, lines)

    def settle_tail(self, source: SourceInfo) -> None:
        """``source`` was read to its end (for now): keep only the bytes its tail needs (:meth:`TailKeeper.settle`)."""
        keeper = self._tails.get(source)
        if keeper is not None:
            keeper.settle()

    @property
    def progress(self) -> list[Progress]:
        """What collective-timeout lines told of each rank's progress (for the laggards of a hang)."""
        return list(self._progress)

    @property
    def ranks_read(self) -> dict[int, str | None]:
        """The ranks whose logs were read, and their nodes."""
        return {source.rank: source.node for source in self._tails if source.rank is not None}

    @property
    def tails(self) -> dict[SourceInfo, Tail]:
        """The last bytes of every source seen through :meth:`keep_tail`, with the lines it survived.

        The lines of an excused fault are marked survived
        (:attr:`~kcover.classify.fallback.Tail.survived`), so the fallback does
        not take back what the rule excused, and those of a degraded sign
        marked degraded: a rule named them, not as a failure.
        """
        tails, excused = self._judge()
        survived: dict[str, set[int]] = {}
        for key in excused:
            survived.setdefault(key[0], set()).update(self._seen_at[key])
        return {
            source: replace(
                tail,
                survived=frozenset(survived.get(source.name, ())),
                degraded=frozenset(self._degraded_at.get(source, ())),
            )
            for source, tail in tails.items()
        }

    @property
    def faults(self) -> list[Fault]:
        """Every distinct fault with its repeat count, in first-seen order.

        A fault whose rule names ``unless_after`` lines is left out when one of
        them came shortly before each of its occurrences, all in the kept end of
        its log (the program logged that exception and went on); one occurrence
        without that excuse keeps the fault.
        """
        excused = self._judge()[1]
        return [
            replace(fault, count=self._counts[key]) if self._counts[key] != fault.count else fault
            for key, fault in self._faults.items()
            if key not in excused
        ]

    def _judge(self) -> tuple[dict[SourceInfo, Tail], set[tuple[str, str, str]]]:
        """The kept end of every source, and the faults it excuses (once per change of the collector)."""
        if self._judged is None or self._judged[0] != self._changes:
            tails = {source: keeper.tail() for source, keeper in self._tails.items()}
            self._judged = (self._changes, tails, self._excused(tails))
        return self._judged[1], self._judged[2]

    def _excused(self, tails: dict[SourceInfo, Tail]) -> set[tuple[str, str, str]]:
        """The faults every occurrence of which came shortly after one of their rule's ``unless_after`` lines.

        Faults are kept by source name: where two sources share a name (the
        file readers name each file apart, :func:`~kcover.collect.sources.find_sources`;
        a caller's own sources may not), which end holds the lines is unknown,
        and nothing of theirs is excused.
        """
        if not self._excusable:
            return set()
        by_name: dict[str, Tail | None] = {}
        for source, kept in tails.items():
            by_name[source.name] = None if source.name in by_name else kept
        excused = set()
        for key, rule in self._excusable.items():
            tail = by_name.get(key[0])
            seen = self._seen_at[key]
            if tail is None or not seen or len(seen) != self._counts[key] or len(seen) > MAX_EXCUSED_REPEATS:
                continue
            if all(self._follows_excuse(tail, line_number, rule) for line_number in seen):
                excused.add(key)
        return excused

    @staticmethod
    def _follows_excuse(tail: Tail, line_number: int, rule: Rule) -> bool:
        before = lines_before(tail, line_number, UNLESS_AFTER_LINES)
        return any(regex.search(line) for line in before for regex in rule.unless_after)
