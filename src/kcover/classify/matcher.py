"""Matching log lines against the catalog: which rule, if any, a line is a sign of.

:class:`Matcher` is the one place a line becomes a fault.  It asks the engine
for candidate offsets in a block, decodes only those lines, skips the parts of
a Python traceback that are code rather than an error (``File "…"`` frames and
their source lines: the final exception line decides), and confirms each line
with the rules' Python regexes.  When several rules match one line, the rule of
highest priority wins, so a specific rule (``torch.OutOfMemoryError``) beats a
generic one (any ``…Error:`` line).  Decisions are cached per distinct line, so
a flood of 100,000 identical lines costs one regex pass.

Time and memory per line are bounded whatever the input, so neither the
launcher's output pump nor the node agent can be stalled by one line.  A line
longer than :data:`WHOLE_LINE_BYTES` is never given whole to a Python regex:
only windows of :data:`WINDOW_BYTES` either side of the engine's hits are
decoded and confirmed (a cut edge reads as ``…``, so ``^`` and ``$`` cannot
match there), and the line's prefixes (CRI time, ``[rank3]:``) are read from
its head.  A match must therefore lie within a window of a hit, which every
catalog pattern does by far.  The decision cache holds at most
:data:`CACHE_ENTRIES` lines and :data:`CACHE_BYTES` of their text.
"""

from __future__ import annotations

import re
import sys
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache

from kcover.classify.engine import ALL_RULES, Engine, make_engine
from kcover.classify.rules import Rule, load_catalog_files, shipped_catalog_files
from kcover.collect.lines import LogLine, parse_line

CACHE_ENTRIES = 8192
CACHE_BYTES = 8 << 20
WHOLE_LINE_BYTES = 4096
"""Lines up to this long are confirmed whole; longer ones on windows around the engine's hits."""
WINDOW_BYTES = 2048
"""Context kept on each side of an engine hit in a long line."""
_LONG_TEXT_CHARS = 2 * WHOLE_LINE_BYTES
_HEAD_BYTES = 512
_CUT = "…"
CacheKey = tuple[str, frozenset[int]]
_LEADING_STAMP = re.compile(r"^\[?[\d\-T:., Z+]{8,}\]?\s*")
_FRAME = re.compile(r'\s+File "')


@dataclass(frozen=True)
class Hit:
    """A line that a rule recognised, with its 1-based line number in its source."""

    line_number: int
    line: LogLine
    rule: Rule


class DecisionCache:
    """Least-recently-used decisions per line text, bounded in entries and in bytes of text."""

    def __init__(self, max_entries: int = CACHE_ENTRIES, max_bytes: int = CACHE_BYTES) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.bytes = 0
        self._entries: OrderedDict[CacheKey, tuple[Rule | None, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: CacheKey) -> tuple[bool, Rule | None]:
        """``(True, decision)`` when ``key`` is cached, else ``(False, None)``."""
        found = self._entries.get(key)
        if found is None:
            return False, None
        self._entries.move_to_end(key)
        return True, found[0]

    def put(self, key: CacheKey, decision: Rule | None) -> None:
        size = sys.getsizeof(key[0]) + 8 * len(key[1]) + 200
        if size > self.max_bytes // 64:
            return
        self._entries[key] = (decision, size)
        self.bytes += size
        while len(self._entries) > self.max_entries or self.bytes > self.max_bytes:
            _, (_, dropped) = self._entries.popitem(last=False)
            self.bytes -= dropped


class Matcher:
    """Classifies blocks of log text with a fixed catalog (safe to share, not thread-safe)."""

    def __init__(self, rules: Sequence[Rule], engine: str = "auto") -> None:
        self.rules = tuple(rules)
        self._line_rules = tuple(rule for rule in self.rules if rule.spec.patterns)
        self.engine: Engine = make_engine(self._line_rules, engine)
        self.cache = DecisionCache()
        self._everything = frozenset(range(len(self._line_rules)))

    @classmethod
    def default(cls, extra_catalogs: Iterable[str] = (), engine: str = "auto") -> Matcher:
        """The shipped catalog plus the user's catalog files."""
        from pathlib import Path

        files = shipped_catalog_files() + [Path(p) for p in extra_catalogs]
        return cls(load_catalog_files(files), engine=engine)

    def classify_text(self, text: str, candidates: frozenset[int] | None = None) -> Rule | None:
        """The winning rule for one decoded line, or ``None`` for a benign line.

        ``candidates`` narrows the rules tried to those the engine flagged.  A
        text longer than a few kilobytes is confirmed on windows around the
        engine's hits, like a long line in a block.
        """
        if len(text) > _LONG_TEXT_CHARS:
            raw = text.encode("utf-8", errors="replace")
            found = self._classify_long(raw, self.engine.candidates(raw), with_prefixes=False)
            return found[0] if found else None
        key = (_LEADING_STAMP.sub("", text, count=1), candidates or self._everything)
        cached, decision = self.cache.get(key)
        if cached:
            return decision
        best: Rule | None = None
        for index in sorted(key[1]):
            rule = self._line_rules[index]
            if (best is None or rule.spec.priority > best.spec.priority) and rule.matches(text):
                best = rule
        self.cache.put(key, best)
        return best

    def scan_block(self, block: bytes, first_line: int) -> Iterator[Hit]:
        """Hits in one cleaned block whose first line has number ``first_line``."""
        yield from self.scan_counted(block, first_line)[0]

    def scan_counted(self, block: bytes, first_line: int) -> tuple[list[Hit], int]:
        """The hits of :meth:`scan_block`, and the number of line breaks in ``block``.

        Numbering the hits counts the line breaks up to the last of them; the
        rest of the block is counted from there, so each byte is counted once.
        """
        found: list[Hit] = []
        offsets = self.engine.candidates(block)
        if not offsets:
            return found, block.count(b"\n")
        line_number = first_line
        counted_to = 0
        lines: dict[int, list[tuple[int, int]]] = {}
        for end, rule_index in offsets:
            start = block.rfind(b"\n", 0, max(end - 1, 0)) + 1
            lines.setdefault(start, []).append((end - start, rule_index))
        for start, hits in lines.items():
            line_number += block.count(b"\n", counted_to, start)
            counted_to = start
            stop = block.find(b"\n", start)
            raw = block[start:] if stop < 0 else block[start:stop]
            line = parse_line(raw if len(raw) <= WHOLE_LINE_BYTES else raw[:_HEAD_BYTES])
            if _is_traceback_code(block, start, line.message):
                continue
            classified = self._classify_raw(raw, hits, line)
            if classified is not None:
                found.append(Hit(line_number=line_number, line=classified[1], rule=classified[0]))
        return found, line_number - first_line + block.count(b"\n", counted_to)

    def _classify_raw(self, raw: bytes, hits: list[tuple[int, int]], line: LogLine) -> tuple[Rule, LogLine] | None:
        """The winner of one raw line given the engine's hits in it and the line parsed (its head if long)."""
        if len(raw) > WHOLE_LINE_BYTES:
            return self._classify_long(raw, hits, with_prefixes=True)
        winner = self.classify_text(line.message, _candidates(hits))
        return (winner, line) if winner is not None else None

    def _classify_long(
        self, raw: bytes, hits: list[tuple[int, int]], *, with_prefixes: bool
    ) -> tuple[Rule, LogLine] | None:
        """Confirm a long line on windows around its hits; the best rule and its window."""
        best: tuple[Rule, str] | None = None
        for start, stop, rules in _windows(len(raw), hits):
            text = _window_text(raw, start, stop, with_prefixes)
            winner = self.classify_text(text, _candidates(rules))
            if winner is not None and (best is None or winner.spec.priority > best[0].spec.priority):
                best = (winner, text)
        if best is None:
            return None
        head = parse_line(raw[:_HEAD_BYTES]) if with_prefixes else LogLine(text="")
        return best[0], LogLine(text=best[1], timestamp=head.timestamp, rank=head.rank, node=head.node,
                                rank_in_text=head.rank_in_text)


@lru_cache(maxsize=4)
def default_matcher(catalogs: tuple[str, ...] = (), engine: str = "auto") -> Matcher:
    """The shipped catalog (plus user catalogs), compiled once per process."""
    return Matcher.default(catalogs, engine=engine)


def _candidates(hits: list[tuple[int, int]]) -> frozenset[int] | None:
    rules = frozenset(rule for _, rule in hits)
    return None if ALL_RULES in rules else rules


def _windows(length: int, hits: list[tuple[int, int]]) -> list[tuple[int, int, list[tuple[int, int]]]]:
    """Byte windows around the hits of one line; a hit close to the last window joins it.

    Every hit keeps at least :data:`WINDOW_BYTES` before it and a quarter of
    that after it inside its window.
    """
    windows: list[tuple[int, int, list[tuple[int, int]]]] = []
    for end, rule in sorted(hits):
        if windows and end + WINDOW_BYTES // 4 <= windows[-1][1]:
            windows[-1][2].append((end, rule))
            continue
        windows.append((max(0, end - WINDOW_BYTES), min(length, end + WINDOW_BYTES), [(end, rule)]))
    return windows


def _window_text(raw: bytes, start: int, stop: int, with_prefixes: bool) -> str:
    """One window decoded, prefixes stripped at the line's head, cut edges shown as ``…``."""
    piece = raw[start:stop]
    text = parse_line(piece).message if start == 0 and with_prefixes else piece.decode("utf-8", errors="replace")
    return (_CUT if start > 0 else "") + text + (_CUT if stop < len(raw) else "")


def _is_traceback_code(block: bytes, start: int, message: str) -> bool:
    """A ``File "…"`` frame of a Python traceback, or the source line shown under one (by their messages)."""
    if _FRAME.match(message):
        return True
    if start == 0 or not message[:1].isspace():
        return False
    previous_start = block.rfind(b"\n", 0, start - 1) + 1
    return bool(_FRAME.match(parse_line(block[previous_start : min(start - 1, previous_start + _HEAD_BYTES)]).message))
