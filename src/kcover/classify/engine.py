"""Finding candidate lines fast: Hyperscan when installed, Python ``re`` otherwise.

Scanning is two-stage.  An *engine* looks at a whole block of bytes (a megabyte
of log at a time) and reports the offsets where some rule's pattern may end;
only the lines around those offsets are decoded and checked again by the
authoritative Python regular expressions in :mod:`kcover.classify.matcher`.
On logs that are 99.9% benign, nearly every byte is handled inside the engine's
C code and Python touches almost nothing.

Hyperscan compiles every pattern in prefilter mode (a superset match), so any
Python pattern works even where Hyperscan lacks a construct.  The fallback
engine uses one combined Python regex over the block; it is correct but slower,
and ``kcover explain --engine`` names which one ran.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Protocol

from kcover.classify.rules import Rule


class Engine(Protocol):
    """Reports end offsets of possible matches within one block of bytes."""

    name: str

    def candidates(self, block: bytes) -> list[int]:
        """Offsets just past each possible match, in increasing order."""
        ...


def _hyperscan_pattern(pattern: str) -> bytes:
    # Lines are re-checked by Python after normalisation (CRI and launcher
    # prefixes stripped), so a leading anchor must not hide a raw-block hit.
    return pattern.removeprefix("^").encode("utf-8")


class HyperscanEngine:
    """All patterns in one Hyperscan database, block mode, multiline, prefilter."""

    name = "hyperscan"

    def __init__(self, rules: Sequence[Rule]) -> None:
        import hyperscan

        expressions: list[bytes] = []
        flags: list[int] = []
        base = hyperscan.HS_FLAG_PREFILTER | hyperscan.HS_FLAG_MULTILINE
        for rule in rules:
            extra = hyperscan.HS_FLAG_CASELESS if rule.spec.ignore_case else 0
            for pattern in rule.spec.patterns:
                expressions.append(_hyperscan_pattern(pattern))
                flags.append(base | extra)
        self._database = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
        self._empty = not expressions
        if expressions:
            self._database.compile(
                expressions=expressions,
                ids=list(range(len(expressions))),
                elements=len(expressions),
                flags=flags,
            )

    def candidates(self, block: bytes) -> list[int]:
        if self._empty:
            return []
        hits: list[int] = []
        append = hits.append

        def on_match(_id: int, _start: int, end: int, _flags: int, _context: object) -> None:
            append(end)

        self._database.scan(block, match_event_handler=on_match)
        hits.sort()
        return hits


class RegexEngine:
    """One combined Python regex over the block; the portable fallback."""

    name = "re"

    def __init__(self, rules: Sequence[Rule]) -> None:
        alternatives: list[str] = []
        for rule in rules:
            flag = "(?i:" if rule.spec.ignore_case else "(?:"
            alternatives.extend(f"{flag}{pattern.removeprefix('^')})" for pattern in rule.spec.patterns)
        joined = "|".join(alternatives) or r"(?!x)x"
        self._regex = re.compile(joined.encode("utf-8"), re.MULTILINE)

    def candidates(self, block: bytes) -> list[int]:
        return [match.end() for match in self._regex.finditer(block)]


def hyperscan_available() -> bool:
    try:
        import hyperscan  # noqa: F401
    except ImportError:
        return False
    return True


def make_engine(rules: Sequence[Rule], prefer: str = "auto") -> Engine:
    """Build the fastest engine available (``auto``), or the one named."""
    if prefer not in ("auto", "hyperscan", "re"):
        raise ValueError(f"unknown engine {prefer!r}: choose auto, hyperscan or re")
    if prefer == "re" or (prefer == "auto" and not hyperscan_available()):
        return RegexEngine(rules)
    return HyperscanEngine(rules)
