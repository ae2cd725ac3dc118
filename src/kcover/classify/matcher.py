"""Matching log lines against the catalog: which rule, if any, a line is a sign of.

:class:`Matcher` is the one place a line becomes a fault.  It asks the engine
for candidate offsets in a block, decodes only those lines, skips the parts of
a Python traceback that are code rather than an error (``File "…"`` frames and
their source lines: the final exception line decides), and confirms each line
with the rules' Python regexes.  When several rules match one line, the rule of
highest priority wins, so a specific rule (``torch.OutOfMemoryError``) beats a
generic one (any ``…Error:`` line).  Decisions are cached per distinct line, so
a flood of 100,000 identical lines costs one regex pass.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from kcover.classify.engine import ALL_RULES, Engine, make_engine
from kcover.classify.rules import Rule, load_catalog_files, shipped_catalog_files
from kcover.collect.lines import LogLine, parse_line

_CACHE_SIZE = 8192
_LEADING_STAMP = re.compile(r"^\[?[\d\-T:., Z+]{8,}\]?\s*")
_PREFIX = rb"^(?:\S+ std(?:out|err) [FP] )?(?:\[(?:rank|default)?\d+\]:|\[\d+,\d+\]<std\w+>:)?"
_FRAME = re.compile(_PREFIX + rb"\s+File \"")
_INDENTED = re.compile(_PREFIX + rb"\s")


@dataclass(frozen=True)
class Hit:
    """A line that a rule recognised, with its 1-based line number in its source."""

    line_number: int
    line: LogLine
    rule: Rule


class Matcher:
    """Classifies blocks of log text with a fixed catalog (safe to share, not thread-safe)."""

    def __init__(self, rules: Sequence[Rule], engine: str = "auto") -> None:
        self.rules = tuple(rules)
        self._line_rules = tuple(rule for rule in self.rules if rule.spec.patterns)
        self.engine: Engine = make_engine(self._line_rules, engine)
        self._cache: OrderedDict[tuple[str, frozenset[int]], Rule | None] = OrderedDict()
        self._everything = frozenset(range(len(self._line_rules)))

    @classmethod
    def default(cls, extra_catalogs: Iterable[str] = (), engine: str = "auto") -> Matcher:
        """The shipped catalog plus the user's catalog files."""
        from pathlib import Path

        files = shipped_catalog_files() + [Path(p) for p in extra_catalogs]
        return cls(load_catalog_files(files), engine=engine)

    def classify_text(self, text: str, candidates: frozenset[int] | None = None) -> Rule | None:
        """The winning rule for one decoded line, or ``None`` for a benign line.

        ``candidates`` narrows the rules tried to those the engine flagged.
        """
        key = (_LEADING_STAMP.sub("", text, count=1), candidates or self._everything)
        cache = self._cache
        if key in cache:
            cache.move_to_end(key)
            return cache[key]
        best: Rule | None = None
        for index in sorted(key[1]):
            rule = self._line_rules[index]
            if (best is None or rule.spec.priority > best.spec.priority) and rule.matches(text):
                best = rule
        cache[key] = best
        if len(cache) > _CACHE_SIZE:
            cache.popitem(last=False)
        return best

    def scan_block(self, block: bytes, first_line: int) -> Iterator[Hit]:
        """Hits in one cleaned block whose first line has number ``first_line``."""
        offsets = self.engine.candidates(block)
        if not offsets:
            return
        line_number = first_line
        counted_to = 0
        lines: dict[int, set[int]] = {}
        for end, rule_index in offsets:
            start = block.rfind(b"\n", 0, max(end - 1, 0)) + 1
            lines.setdefault(start, set()).add(rule_index)
        for start, rules in lines.items():
            line_number += block.count(b"\n", counted_to, start)
            counted_to = start
            stop = block.find(b"\n", start)
            raw = block[start:] if stop < 0 else block[start:stop]
            if _is_traceback_code(block, start, raw):
                continue
            line = parse_line(raw)
            candidates = None if ALL_RULES in rules else frozenset(rules)
            winner = self.classify_text(line.text, candidates)
            if winner is not None:
                yield Hit(line_number=line_number, line=line, rule=winner)


def _is_traceback_code(block: bytes, start: int, raw: bytes) -> bool:
    """A ``File "…"`` frame of a Python traceback, or the source line shown under one."""
    if _FRAME.match(raw):
        return True
    if start == 0 or not _INDENTED.match(raw):
        return False
    previous_start = block.rfind(b"\n", 0, start - 1) + 1
    return bool(_FRAME.match(block[previous_start : start - 1]))
