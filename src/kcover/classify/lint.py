"""Refusing regular expressions that could take more than linear time on a log line.

Python's ``re`` backtracks.  A catalog pattern runs on every flagged line of
every job, including hostile ones (a 1 MiB run of digits, of spaces, of the
pattern's own words), so one badly shaped pattern can stall ``kcover run``'s
output pump or blind the node agent for hours.  :func:`regex_problem` reads the
parsed pattern (``re._parser``, as :mod:`kcover.classify.literals` does) and
says why a pattern is refused, or ``None``.  It is run on every catalog text
not checked before, shipped and user files alike, for ``patterns`` and
``unless`` patterns (a text that passed is remembered, keyed by a digest of
the text and of this module: :mod:`kcover.classify.rules`).

The shapes refused, and why each is enough:

* **Nested repeats.**  ``(a+)+``, ``(\\w+\\s?)*``, ``(a|aa)+``: when the body of
  a repeat can match text in several ways, a failing match tries every way of
  cutting the text into iterations (exponential).  A repeated group is
  accepted only when its body is one character class, or when its first or
  last element is a required character that nothing else in the body can
  match (``(?:\\w+\\.)*``): that character then marks where each iteration
  ends, so the cut is unique.
* **Adjacent overlapping repeats.**  ``\\d+\\d+``, ``.*\\s*.*``: two unbounded
  repeats with only optional parts between them and a character in common
  can share a run of that character in n ways, and each way is tried
  (quadratic, cubic with three).  Repeats bounded by at most
  :data:`LOOP_BOUND` count as constants here.
* **An unbounded repeat where a search starts.**  ``re.search`` retries a
  pattern from every position, so ``\\d+ Killed`` on 50,000 digits consumes
  the run from each of them and fails at its end: quadratic without any
  nesting.  This is the same rule as the previous one if the search is seen as
  an implicit ``.*?`` in front of the pattern.  What stops it is anything
  that must fail inside a run of the repeated character before the repeat:
  an anchor (``^``), ``\\b`` (never true between two equal characters), a
  required character outside the class (``x\\d+``), or a look-behind such as
  ``(?<!\\d)\\d+``, which lets only the first digit of a run start a match and
  keeps the pattern's meaning.  A required character *inside* the class does
  not (``\\w\\d+`` is still quadratic), so the analysis carries the set of
  characters each still-open repeat can share with what follows.
* **Repeats inside look-arounds**, which run at every position
  (``(?=.*x)`` is quadratic); **back-references and conditional groups**,
  which no prefilter can bound; and **counts above** :data:`MAX_BOUND`
  (``x{60000}`` costs 60,000 steps per start and Hyperscan refuses it).

Character classes are compared over a sample of code points (ASCII, Latin-1,
common Unicode spaces and digits, and every character the pattern names,
with case variants under ``ignore_case``), which is exact for the classes a
catalog uses.  The check is deliberately conservative: a refused pattern can
always be rewritten, while an accepted one runs in time linear in the line
(times the constant bounds above).  As a second line of defence the matcher
runs these regexes only on bounded windows of a line, never a whole 1 MiB line.
"""

from __future__ import annotations

import functools
import re
import re._constants as sre
import re._parser as sre_parse
from collections.abc import Iterable, Iterator
from typing import Any

MAX_BOUND = 1000
"""Largest count accepted in ``{m,n}``."""

LOOP_BOUND = 255
"""Repeats allowing more than this many iterations count as unbounded."""

CharSet = frozenset[int]
_SEARCH = -1
"""Not a character: marks the implicit ``.*?`` of ``re.search`` in front of a pattern."""
_MARKER = frozenset({_SEARCH})

Loop = tuple[CharSet, frozenset[CharSet]]
"""An open repeat: its characters, and the classes of the required characters since it."""
Open = frozenset[Loop]
Item = tuple[Any, Any]

_SAMPLE = (
    set(range(0x250))
    | {0x2028, 0x2029, 0x1680, 0x3000, 0x202F, 0x205F, 0x200B, 0xFEFF, 0xFFFD}
    | set(range(0x2000, 0x200B))
    | {0x660, 0x966, 0xFF10, 0x1D7CE, 0x3B1, 0x391, 0x430, 0x410, 0x4E00, 0x212A, 0x2126, 0x10000}
)
_CATEGORY_REGEX = {
    sre.CATEGORY_DIGIT: r"\d", sre.CATEGORY_NOT_DIGIT: r"\D",
    sre.CATEGORY_SPACE: r"\s", sre.CATEGORY_NOT_SPACE: r"\S",
    sre.CATEGORY_WORD: r"\w", sre.CATEGORY_NOT_WORD: r"\W",
    sre.CATEGORY_LINEBREAK: r"\n", sre.CATEGORY_NOT_LINEBREAK: r"[^\n]",
}
_CATEGORY_TEXT = {
    sre.CATEGORY_DIGIT: r"\d", sre.CATEGORY_NOT_DIGIT: r"\D",
    sre.CATEGORY_SPACE: r"\s", sre.CATEGORY_NOT_SPACE: r"\S",
    sre.CATEGORY_WORD: r"\w", sre.CATEGORY_NOT_WORD: r"\W",
}
_ATOMS = (sre.LITERAL, sre.NOT_LITERAL, sre.ANY, sre.IN)
_REPEATS = (sre.MAX_REPEAT, sre.MIN_REPEAT, sre.POSSESSIVE_REPEAT)
_KILLING_ANCHORS = (
    sre.AT_BEGINNING, sre.AT_BEGINNING_STRING, sre.AT_BEGINNING_LINE,
    sre.AT_END, sre.AT_END_STRING, sre.AT_END_LINE, sre.AT_BOUNDARY,
    sre.AT_UNI_BOUNDARY, sre.AT_LOC_BOUNDARY,
)


class _RefusedError(Exception):
    """Raised inside the analysis with the reason a pattern is refused."""


def regex_problem(pattern: str, ignore_case: bool = False) -> str | None:
    """Why ``pattern`` is refused (super-linear, or matches the empty string), or ``None``."""
    try:
        parsed = sre_parse.parse(pattern, re.IGNORECASE if ignore_case else 0)
    except (re.error, OverflowError, RecursionError) as exc:
        return f"not a valid regular expression: {exc}"
    items = list(parsed)
    if _nullable(items):
        return "can match the empty string (it would match every line)"
    folded = ignore_case or bool(parsed.state.flags & re.IGNORECASE)
    analysis = _Analysis(_universe(items, folded), folded)
    try:
        analysis.sequence(items, frozenset({(analysis.universe | _MARKER, frozenset())}), folded)
    except _RefusedError as refusal:
        return str(refusal)
    except RecursionError:
        return "too deeply nested to analyse"
    return None


def _nullable(items: Iterable[Item]) -> bool:
    """True when the sequence can match without consuming a character."""
    return all(_item_nullable(op, av) for op, av in items)


def _item_nullable(op: Any, av: Any) -> bool:
    if op in _ATOMS:
        return False
    if op in _REPEATS:
        return bool(av[0] == 0 or _nullable(av[2]))
    if op is sre.SUBPATTERN:
        return _nullable(av[-1])
    if op is sre.ATOMIC_GROUP:
        return _nullable(av)
    if op is sre.BRANCH:
        return any(_nullable(branch) for branch in av[1])
    return True


def _walk(items: Iterable[Item]) -> Iterator[Item]:
    """Every node of a parsed pattern, depth first."""
    for op, av in items:
        yield op, av
        for child in _children(op, av):
            yield from _walk(child)


def _children(op: Any, av: Any) -> list[list[Item]]:
    if op in _REPEATS:
        return [list(av[2])]
    if op is sre.SUBPATTERN:
        return [list(av[-1])]
    if op in (sre.ASSERT, sre.ASSERT_NOT):
        return [list(av[1])]
    if op is sre.ATOMIC_GROUP:
        return [list(av)]
    if op is sre.BRANCH:
        return [list(branch) for branch in av[1]]
    if op is sre.GROUPREF_EXISTS:
        return [list(branch) for branch in av[1:] if branch is not None]
    return []


@functools.cache
def _variants(code: int) -> frozenset[int]:
    """The code point and its one-character case variants."""
    char = chr(code)
    found = {code}
    for other in (char.lower(), char.upper(), char.casefold()):
        if len(other) == 1:
            found.add(ord(other))
    return frozenset(found)


def _universe(items: list[Item], folded: bool) -> CharSet:
    """The sample code points: fixed ones plus every character the pattern names."""
    codes: set[int] = set()
    for op, av in _walk(items):
        if op in (sre.LITERAL, sre.NOT_LITERAL):
            codes.add(av)
        elif op is sre.IN:
            for kind, value in av:
                if kind is sre.LITERAL:
                    codes.add(value)
                elif kind is sre.RANGE:
                    codes.update(value)
    codes -= _FOLDED_SAMPLE
    if folded:
        codes = {variant for code in codes for variant in _variants(code)}
    return _FOLDED_SAMPLE | codes


_FOLDED_SAMPLE = frozenset(variant for code in _SAMPLE for variant in _variants(code))


@functools.cache
def _sample_category(category: Any) -> CharSet:
    return frozenset(code for code in _FOLDED_SAMPLE if _in_category(category, code))


def _in_category(category: Any, code: int) -> bool:
    return bool(_category_regex(category).match(chr(code)))


@functools.cache
def _category_regex(category: Any) -> re.Pattern[str]:
    return re.compile(_CATEGORY_REGEX.get(category, r"[\s\S]"))


class _Analysis:
    """Walks a parsed pattern carrying the repeats still open, refusing bad shapes."""

    def __init__(self, universe: CharSet, folded: bool) -> None:
        self.universe = universe
        self.folded = folded
        self._categories: dict[Any, CharSet] = {}

    # -- character sets -------------------------------------------------

    def atom(self, op: Any, av: Any, folded: bool) -> CharSet | None:
        """The characters one single-character node matches, or None for other nodes."""
        if op is sre.LITERAL:
            raw = frozenset({av})
        elif op is sre.NOT_LITERAL:
            raw = self.universe - self._fold(frozenset({av}), folded)
        elif op is sre.ANY:
            return self.universe
        elif op is sre.IN:
            raw = self._class(av, folded)
        else:
            return None
        return self._fold(raw, folded)

    def _fold(self, chars: CharSet, folded: bool) -> CharSet:
        if not folded or chars == self.universe:
            return chars
        found = set(chars)
        for code in chars:
            found.update(_variants(code))
        return frozenset(found) & self.universe

    def _class(self, items: list[Item], folded: bool) -> CharSet:
        chars: set[int] = set()
        negate = False
        for kind, value in items:
            if kind is sre.NEGATE:
                negate = True
            elif kind is sre.LITERAL:
                chars.add(value)
            elif kind is sre.RANGE:
                chars.update(code for code in self.universe if value[0] <= code <= value[1])
            elif kind is sre.CATEGORY:
                chars.update(self._category(value))
        result = frozenset(chars)
        return self.universe - self._fold(result, folded) if negate else result

    def _category(self, category: Any) -> CharSet:
        if category not in self._categories:
            extra = (code for code in self.universe - _FOLDED_SAMPLE if _in_category(category, code))
            self._categories[category] = _sample_category(category) | frozenset(extra)
        return self._categories[category]

    def single(self, body: list[Item], folded: bool) -> CharSet | None:
        """The character set when ``body`` is one single-character node (groups unwrapped)."""
        if len(body) != 1:
            return None
        op, av = body[0]
        if op is sre.SUBPATTERN:
            return self.single(list(av[-1]), _scoped(folded, av))
        return self.atom(op, av, folded)

    def consumed(self, items: Iterable[Item], folded: bool) -> CharSet:
        """Every character some node of ``items`` can consume (look-arounds excluded)."""
        chars: set[int] = set()
        for op, av in items:
            found = self.atom(op, av, folded)
            if found is not None:
                chars.update(found)
            elif op is sre.SUBPATTERN:
                chars.update(self.consumed(av[-1], _scoped(folded, av)))
            elif op not in (sre.ASSERT, sre.ASSERT_NOT):
                for child in _children(op, av):
                    chars.update(self.consumed(child, folded))
        return frozenset(chars)

    # -- the walk -------------------------------------------------------

    def sequence(self, items: Iterable[Item], open_: Open, folded: bool) -> Open:
        """Check a sequence entered with the repeats ``open_``; the repeats open after it."""
        for op, av in items:
            open_ = self.item(op, av, open_, folded)
        return open_

    def item(self, op: Any, av: Any, open_: Open, folded: bool) -> Open:
        chars = self.atom(op, av, folded)
        if chars is not None:
            return _narrow(open_, chars)
        if op in _REPEATS:
            return self.repeat(av, open_, folded)
        if op is sre.SUBPATTERN:
            return self.sequence(av[-1], open_, _scoped(folded, av))
        if op is sre.ATOMIC_GROUP:
            return self.sequence(av, open_, folded)
        if op is sre.BRANCH:
            return frozenset().union(*(self.sequence(b, open_, folded) for b in av[1]))
        if op is sre.AT:
            return frozenset() if av in _KILLING_ANCHORS else open_
        if op in (sre.ASSERT, sre.ASSERT_NOT):
            return self.lookaround(op, av, open_, folded)
        if op in (sre.GROUPREF, sre.GROUPREF_EXISTS):
            raise _RefusedError("back-references and conditional groups are not allowed "
                           "(no prefilter can bound them, and they backtrack)")
        raise _RefusedError(f"unsupported construct {op}")

    def lookaround(self, op: Any, av: Any, open_: Open, folded: bool) -> Open:
        body = list(av[1])
        for inner_op, inner_av in _walk(body):
            if inner_op in _REPEATS and _is_loop(inner_av):
                raise _RefusedError("a look-ahead or look-behind contains an unbounded repeat "
                               f"{_render(inner_op, inner_av)}; it would rescan the line at every position")
        self.sequence(body, frozenset(), folded)
        chars = self.single(body, folded)
        if chars is None:
            return open_
        kept = chars if op is sre.ASSERT else self.universe - chars
        return frozenset(_guard(loop, kept) for loop in open_ if _guard(loop, kept)[0] - _MARKER)

    def repeat(self, av: Any, open_: Open, folded: bool) -> Open:
        low, high, body = av[0], av[1], list(av[2])
        for count in (low, high):
            if count != sre.MAXREPEAT and count > MAX_BOUND:
                raise _RefusedError(f"repeat count {count} is above {MAX_BOUND}")
        chars = self.single(body, folded)
        skipped = open_ if low == 0 else frozenset()
        if chars is not None:
            return self._char_repeat((sre.MAX_REPEAT, av), chars, open_, skipped)
        if high >= 2:
            self._require_delimiter(av, body, folded)
        once = self.sequence(body, open_, folded)
        twice = self.sequence(body, once, folded) if high >= 2 else frozenset()
        return once | twice | skipped

    def _char_repeat(self, node: Item, chars: CharSet, open_: Open, skipped: Open) -> Open:
        if not _is_loop(node[1]):
            return _narrow(open_, chars) | skipped
        bounded = node[1][1] != sre.MAXREPEAT
        for loop in open_:
            if bounded and _SEARCH in loop[0]:
                continue  # at most a constant number of steps from each start
            if _can_share(loop, chars):
                raise _RefusedError(_overlap_reason(node, _SEARCH in loop[0]))
        return frozenset({(chars, frozenset())}) | _narrow(open_, chars) | skipped

    def _require_delimiter(self, av: Any, body: list[Item], folded: bool) -> None:
        items = _unwrap(body)
        for index in (0, len(items) - 1):
            edge = self.atom(*items[index], folded) if items else None
            others = items[:index] + items[index + 1 :]
            if edge is not None and not edge & self.consumed(others, folded):
                return
        raise _RefusedError(
            f"nested repeat {_render(sre.MAX_REPEAT, av)}: the repeated group has no first or last "
            "character that only it can match, so a failing line is cut into iterations in "
            "exponentially many ways"
        )


def _scoped(folded: bool, subpattern: Any) -> bool:
    """The ignore-case state inside a ``(?i:…)`` / ``(?-i:…)`` group."""
    added, removed = subpattern[1], subpattern[2]
    if removed & re.IGNORECASE:
        return False
    return folded or bool(added & re.IGNORECASE)


def _unwrap(body: list[Item]) -> list[Item]:
    while len(body) == 1 and body[0][0] is sre.SUBPATTERN:
        body = list(body[0][1][-1])
    return body


def _is_loop(av: Any) -> bool:
    return bool(av[1] == sre.MAXREPEAT or av[1] > LOOP_BOUND)


def _narrow(open_: Open, chars: CharSet) -> Open:
    """The open repeats after a required character from ``chars``.

    A repeat stays open only when it could also have consumed that character;
    the character's class (as far as the repeat can take it) joins its list.
    """
    narrowed: set[Loop] = set()
    for repeated, between in open_:
        shared = repeated & chars
        if shared:
            narrowed.add((repeated, between | {shared}))
    return frozenset(narrowed)


def _can_share(loop: Loop, chars: CharSet) -> bool:
    """Whether text between an open repeat and a new one ``chars`` can be split between them.

    Both must take some common character, and every required character
    between them must be choosable from that common set: then a run of such
    text can be cut between the two repeats at every point.
    """
    repeated, between = loop
    common = repeated & chars
    return bool(common) and all(needed & common for needed in between)


def _guard(loop: Loop, kept: CharSet) -> Loop:
    """A one-character look-behind or look-ahead right after a repeat: only ``kept`` can precede."""
    repeated, between = loop
    if between:
        return loop
    return (repeated & kept) | (repeated & _MARKER), between


def _overlap_reason(node: Item, at_start: bool) -> str:
    shown = _render(*node)
    if at_start:
        return (f"unbounded repeat {shown} where a search can start: on a long run of its characters "
                "the search retries from every position (quadratic); anchor it (^ or \\b) or guard it "
                "with a look-behind such as (?<!\\d)\\d+")
    return (f"unbounded repeat {shown} can match the same characters as an unbounded repeat just "
            "before it, so a failing line is split between them in every way (polynomial)")


def _render(op: Any, av: Any) -> str:
    """A short regex-like rendering of a node, for error messages."""
    if op in _REPEATS:
        low, high, body = av
        inner = "".join(_render(*node) for node in body)
        inner = inner if len(body) == 1 and body[0][0] in _ATOMS else f"(?:{inner})"
        return inner + _quantifier(low, high)
    if op is sre.LITERAL:
        return re.escape(chr(av))
    if op is sre.NOT_LITERAL:
        return f"[^{re.escape(chr(av))}]"
    if op is sre.ANY:
        return "."
    if op is sre.IN:
        return _render_class(av)
    if op is sre.SUBPATTERN:
        return "(" + "".join(_render(*node) for node in av[-1]) + ")"
    return "…"


def _render_class(items: list[Item]) -> str:
    if len(items) == 1 and items[0][0] is sre.CATEGORY and items[0][1] in _CATEGORY_TEXT:
        return _CATEGORY_TEXT[items[0][1]]
    parts = []
    for kind, value in items:
        if kind is sre.NEGATE:
            parts.append("^")
        elif kind is sre.LITERAL:
            parts.append(re.escape(chr(value)))
        elif kind is sre.RANGE:
            parts.append(f"{re.escape(chr(value[0]))}-{re.escape(chr(value[1]))}")
        elif kind is sre.CATEGORY:
            parts.append(_CATEGORY_TEXT.get(value, "?"))
    return "[" + "".join(parts) + "]"


def _quantifier(low: int, high: int) -> str:
    if high == sre.MAXREPEAT:
        return {0: "*", 1: "+"}.get(low, f"{{{low},}}")
    if (low, high) == (0, 1):
        return "?"
    return f"{{{low}}}" if low == high else f"{{{low},{high}}}"
