"""Required literals of a regular expression: the prefilter of the pure-Python engine.

Where Hyperscan is not installed, kcover still avoids running 280 regexes over
every byte.  For each pattern it finds a set of literals one of which every
match must contain (the longest run of plain characters, or one literal per
branch of an alternation, whichever is more selective) and searches the
lower-cased block for them with ``bytes.find``, which runs at memory speed;
only lines containing one are checked by the real regexes.  Patterns without a
usable literal are searched with a combined regex instead.  Only ASCII
characters and characters without case (CJK, for instance) make literals:
``bytes.lower`` folds ASCII only, so a non-ASCII letter with case could miss
its own line under ``ignore_case``; a caseless one reads the same either way.
"""

from __future__ import annotations

import re
import re._constants as sre_constants
import re._parser as sre_parse
from typing import Any

MIN_LITERAL = 3


def _selectivity(literals: list[str]) -> tuple[int, int]:
    return (min((len(x) for x in literals), default=0), -len(literals))


def _caseless(char: str) -> bool:
    """A character no case folding changes: found by ``bytes.find`` in a lower-cased block, any flags."""
    return char.lower() == char.upper() == char.casefold() == char


def _best(items: Any) -> list[str]:
    """The most selective any-of literal set that a match of ``items`` must contain."""
    candidates: list[list[str]] = []
    run: list[str] = []
    for op, value in items:
        if op is sre_constants.LITERAL and (value < 128 or _caseless(chr(value))):
            run.append(chr(value))
            continue
        if run:
            candidates.append(["".join(run)])
            run = []
        if op is sre_constants.SUBPATTERN:
            candidates.append(_best(value[-1]))
        elif op is sre_constants.BRANCH:
            branches = [_best(branch) for branch in value[1]]
            if all(branches):
                candidates.append([literal for branch in branches for literal in branch])
        elif op in (sre_constants.MAX_REPEAT, sre_constants.MIN_REPEAT) and value[0] >= 1:
            candidates.append(_best(value[2]))
    if run:
        candidates.append(["".join(run)])
    candidates = [c for c in candidates if c]
    return max(candidates, key=_selectivity) if candidates else []


def required_literals(pattern: str) -> list[str] | None:
    """Lower-cased literals, one of which every match contains; ``None`` when there is none."""
    try:
        literals = _best(sre_parse.parse(pattern))
    except re.error:
        return None
    if not literals or min(len(literal) for literal in literals) < MIN_LITERAL:
        return None
    return sorted({literal.lower() for literal in literals})
