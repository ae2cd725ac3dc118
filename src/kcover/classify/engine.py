"""Finding candidate lines fast: Hyperscan when installed, Python ``re`` otherwise.

Scanning is two-stage.  An *engine* looks at a whole block of bytes (a megabyte
of log at a time) and reports the offsets where some rule's pattern may end;
only the lines around those offsets are decoded and checked again by the
authoritative Python regular expressions in :mod:`kcover.classify.matcher`.
On logs that are 99.9% benign, nearly every byte is handled inside the engine's
C code and Python touches almost nothing.

Hyperscan compiles every pattern in prefilter mode (a superset match), so any
Python pattern works even where Hyperscan lacks a construct.  The fallback
engine searches each pattern's required literals (:mod:`kcover.classify.literals`)
with ``bytes.find``; it is correct but slower, and ``kcover explain --json``
names which engine ran.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from kcover.classify.literals import required_literals
from kcover.classify.rules import Rule

ALL_RULES = -1
"""Rule index an engine reports when it cannot tell which rule may match."""


class Engine(Protocol):
    """Reports where possible matches end within one block of bytes, and for which rule."""

    name: str

    def candidates(self, block: bytes) -> list[tuple[int, int]]:
        """``(offset just past a possible match, rule index or ALL_RULES)``, by offset."""
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
        ids: list[int] = []
        base = hyperscan.HS_FLAG_PREFILTER | hyperscan.HS_FLAG_MULTILINE
        for index, rule in enumerate(rules):
            extra = hyperscan.HS_FLAG_CASELESS if rule.spec.ignore_case else 0
            for pattern in rule.spec.patterns:
                expressions.append(_hyperscan_pattern(pattern))
                flags.append(base | extra)
                ids.append(index)
        self._database = _load_or_compile(expressions, flags, ids) if expressions else None

    def candidates(self, block: bytes) -> list[tuple[int, int]]:
        if self._database is None:
            return []
        hits: list[tuple[int, int]] = []
        append = hits.append

        def on_match(rule: int, _start: int, end: int, _flags: int, _context: object) -> None:
            append((end, rule))

        self._database.scan(block, match_event_handler=on_match)
        hits.sort()
        return hits


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kcover"


def _load_or_compile(expressions: list[bytes], flags: list[int], ids: list[int]) -> Any:
    """A block-mode database for these patterns, from the on-disk cache when it is there.

    Compiling the catalog takes about 0.3 s; loading the serialized database a
    few milliseconds.  The cache key covers the patterns, flags, ids and the
    Hyperscan version; a damaged or unwritable cache only costs a recompile.
    """
    import hyperscan

    digest = hashlib.sha256(
        repr((expressions, flags, ids, getattr(hyperscan, "__version__", ""))).encode()
    ).hexdigest()[:24]
    cached = _cache_dir() / f"hyperscan-{digest}.db"
    try:
        database = hyperscan.loadb(cached.read_bytes(), hyperscan.HS_MODE_BLOCK)
        database.scratch = hyperscan.Scratch(database)
        return database
    except Exception:
        pass
    database = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
    database.compile(expressions=expressions, ids=ids, elements=len(expressions), flags=flags)
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        partial = cached.with_suffix(f".{os.getpid()}.tmp")
        partial.write_bytes(hyperscan.dumpb(database))
        partial.replace(cached)
    except OSError:
        pass
    return database


class LiteralEngine:
    """Pure Python: ``bytes.find`` for each pattern's required literals, a regex for the rest."""

    name = "re"

    def __init__(self, rules: Sequence[Rule]) -> None:
        self._literals: dict[bytes, set[int]] = {}
        residual: list[str] = []
        for index, rule in enumerate(rules):
            for pattern in rule.spec.patterns:
                literals = required_literals(pattern)
                if literals is None:
                    flag = "(?i:" if rule.spec.ignore_case else "(?:"
                    residual.append(f"{flag}{pattern.removeprefix('^')})")
                    continue
                for literal in literals:
                    self._literals.setdefault(literal.encode("utf-8"), set()).add(index)
        self._residual = re.compile("|".join(residual).encode("utf-8"), re.MULTILINE) if residual else None

    def candidates(self, block: bytes) -> list[tuple[int, int]]:
        lowered = block.lower()
        hits: list[tuple[int, int]] = []
        for literal, rules in self._literals.items():
            find = lowered.find
            position = find(literal)
            while position >= 0:
                end = position + len(literal)
                hits.extend((end, rule) for rule in rules)
                position = find(literal, end)
        if self._residual is not None:
            hits.extend((match.end(), ALL_RULES) for match in self._residual.finditer(block))
        hits.sort()
        return hits


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
        return LiteralEngine(rules)
    return HyperscanEngine(rules)
