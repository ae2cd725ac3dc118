"""Finding candidate lines fast: Hyperscan when installed, Python ``re`` otherwise.

Scanning is two-stage.  An *engine* looks at a whole block of bytes (a megabyte
of log at a time) and reports the offsets where some rule's pattern may end;
only the lines around those offsets are decoded and checked again by the
authoritative Python regular expressions in :mod:`kcover.classify.matcher`.
On logs that are 99.9% benign, nearly every byte is handled inside the engine's
C code and Python touches almost nothing.

Hyperscan compiles every pattern in prefilter mode (a superset match), so most
Python patterns work even where Hyperscan lacks a construct.  The fallback
engine searches each pattern's required literals (:mod:`kcover.classify.literals`)
with ``bytes.find``; it is correct but slower, and ``kcover explain --json``
names which engine ran.

A user's pattern may be valid Python that an engine cannot take (``\\u00e9``,
``\\N{…}``, an inline ``(?a)`` or ``(?x)``, a look-behind).  Each
pattern then falls back on its own, never the whole catalog and never with a
crash: Hyperscan hands it to the literal engine, and the literal engine, when
the pattern has no literal and the bytes ``re`` cannot compile it, searches the
block decoded as text (``surrogateescape``, so offsets map back to bytes).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from kcover.classify.diskcache import read_cached, write_cached
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


@dataclass(frozen=True)
class PatternEntry:
    """One line pattern of one rule, as an engine compiles it."""

    pattern: str
    rule: int
    ignore_case: bool

    @property
    def unanchored(self) -> str:
        # Lines are re-checked by Python after normalisation (CRI and launcher
        # prefixes stripped, trailing blanks dropped), so a leading anchor must not
        # hide a raw-block hit, nor a line's trailing spaces (a terminal's copy pads
        # lines with them) a line-end anchor.
        pattern = self.pattern.removeprefix("^")
        if pattern.endswith("$") and not pattern.endswith("\\$"):
            pattern = pattern[:-1] + "[ \t]*$"
        return pattern


def pattern_entries(rules: Sequence[Rule]) -> list[PatternEntry]:
    """What the engine searches for each of ``rules``, tagged with its rule's index: the rule's
    ``prefilter`` when it has one (a looser pattern, cheaper to scan for), else its patterns."""
    return [
        PatternEntry(pattern, index, rule.spec.ignore_case)
        for index, rule in enumerate(rules)
        for pattern in rule.spec.prefilter or rule.spec.patterns
    ]


class HyperscanEngine:
    """All patterns in one Hyperscan database, block mode, multiline, prefilter.

    A pattern Hyperscan cannot compile, or one with non-ASCII characters
    (Hyperscan matches bytes, Python matches characters), is searched by a
    :class:`LiteralEngine` of its own instead.
    """

    name = "hyperscan"

    def __init__(self, rules: Sequence[Rule], entries: Sequence[PatternEntry] | None = None) -> None:
        entries = pattern_entries(rules) if entries is None else list(entries)
        taken = [entry for entry in entries if entry.pattern.isascii()]
        refused: list[PatternEntry] = []
        self._database: Any = None
        if taken:
            self._database, refused = _compile_taking_what_compiles(taken)
        rest = [entry for entry in entries if not entry.pattern.isascii()] + refused
        self.fallback = LiteralEngine(rules, rest) if rest else None

    def candidates(self, block: bytes) -> list[tuple[int, int]]:
        hits: list[tuple[int, int]] = []
        append = hits.append

        def on_match(rule: int, _start: int, end: int, _flags: int, _context: object) -> None:
            append((end, rule))

        if self._database is not None:
            self._database.scan(block, match_event_handler=on_match)
        if self.fallback is not None:
            hits.extend(self.fallback.candidates(block))
        hits.sort()
        return hits


def _hyperscan_inputs(entries: Sequence[PatternEntry]) -> tuple[list[bytes], list[int], list[int]]:
    import hyperscan

    base = hyperscan.HS_FLAG_PREFILTER | hyperscan.HS_FLAG_MULTILINE
    expressions = [entry.unanchored.encode("ascii") for entry in entries]
    flags = [base | (hyperscan.HS_FLAG_CASELESS if entry.ignore_case else 0) for entry in entries]
    return expressions, flags, [entry.rule for entry in entries]


def _compile_taking_what_compiles(entries: list[PatternEntry]) -> tuple[Any, list[PatternEntry]]:
    """A database of every entry Hyperscan compiles, and the entries it refused."""
    try:
        return _load_or_compile(*_hyperscan_inputs(entries)), []
    except Exception:  # hyperscan.error; the library raises nothing more specific
        pass
    good = [entry for entry in entries if _compiles_alone(entry)]
    refused = [entry for entry in entries if entry not in good]
    return (_load_or_compile(*_hyperscan_inputs(good)) if good else None), refused


def _compiles_alone(entry: PatternEntry) -> bool:
    import hyperscan

    expressions, flags, ids = _hyperscan_inputs([entry])
    database = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
    try:
        database.compile(expressions=expressions, ids=ids, elements=1, flags=flags)
    except Exception:  # hyperscan.error
        return False
    return True


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
    name = f"hyperscan-{digest}.db"
    serialized = read_cached(name)
    if serialized is not None:
        try:
            database = hyperscan.loadb(serialized, hyperscan.HS_MODE_BLOCK)
            database.scratch = hyperscan.Scratch(database)
            return database
        except Exception:  # hyperscan.error: a damaged file is compiled again
            pass
    database = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
    database.compile(expressions=expressions, ids=ids, elements=len(expressions), flags=flags)
    write_cached(name, hyperscan.dumpb(database))
    return database


class LiteralEngine:
    """Pure Python: ``bytes.find`` for each pattern's required literals, a regex for the rest."""

    name = "re"

    def __init__(self, rules: Sequence[Rule], entries: Sequence[PatternEntry] | None = None) -> None:
        self._literals: dict[bytes, set[int]] = {}
        residual: list[bytes] = []
        self._text: list[tuple[re.Pattern[str], int]] = []
        for entry in pattern_entries(rules) if entries is None else entries:
            literals = required_literals(entry.pattern)
            if literals is not None:
                for literal in literals:
                    self._literals.setdefault(literal.encode("utf-8"), set()).add(entry.rule)
                continue
            wrapped = _bytes_alternative(entry)
            if wrapped is not None:
                residual.append(wrapped)
            else:
                flags = re.MULTILINE | (re.IGNORECASE if entry.ignore_case else 0)
                self._text.append((re.compile(entry.unanchored, flags), entry.rule))
        self._residual = re.compile(b"|".join(residual), re.MULTILINE) if residual else None
        self._literals = _without_redundant(self._literals)
        # Literals are lower-cased; without an ASCII letter among them (a localized message left
        # to this engine by Hyperscan) lower-casing the block would change nothing they can match.
        self._fold = any(literal != literal.upper() for literal in self._literals)

    def candidates(self, block: bytes) -> list[tuple[int, int]]:
        lowered = block.lower() if self._fold else block
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
        if self._text:
            hits.extend(_text_candidates(self._text, block))
        hits.sort()
        return hits


def _without_redundant(literals: dict[bytes, set[int]]) -> dict[bytes, set[int]]:
    """The literals less those that end with another literal of at least the same rules.

    Wherever such a literal occurs, the shorter one ends at the same offset for
    the same rules, so searching the block for it again (a whole pass over a
    megabyte) would only repeat hits already found.
    """
    return {
        literal: rules
        for literal, rules in literals.items()
        if not any(rules <= literals.get(literal[cut:], set()) for cut in range(1, len(literal)))
    }


def _bytes_alternative(entry: PatternEntry) -> bytes | None:
    """The pattern as one branch of the combined bytes regex, or None if bytes ``re`` refuses it."""
    opening = "(?i:" if entry.ignore_case else "(?:"
    try:
        wrapped = f"{opening}{entry.unanchored})".encode()
        re.compile(wrapped)
    except (re.error, UnicodeEncodeError, OverflowError, RecursionError):
        return None
    return wrapped


def _text_candidates(regexes: list[tuple[re.Pattern[str], int]], block: bytes) -> list[tuple[int, int]]:
    """Hits of text regexes on the decoded block, at byte offsets.

    ``surrogateescape`` turns each undecodable byte into one character that
    encodes back to that byte, so counting encoded lengths maps offsets exactly.
    """
    text = block.decode("utf-8", errors="surrogateescape")
    hits: list[tuple[int, int]] = []
    for regex, rule in regexes:
        char_at, byte_at = 0, 0
        for match in regex.finditer(text):
            byte_at += len(text[char_at : match.end()].encode("utf-8", errors="surrogateescape"))
            char_at = match.end()
            hits.append((byte_at, rule))
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
