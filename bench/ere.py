"""Translating catalog patterns (Python regex) into POSIX ERE for GNU ``grep -E -f``.

Only for the scanning benchmark's baseline: grep must search for the same
patterns as kcover.  Case-insensitive rules become ``[xX]`` classes (grep has no
per-pattern flag), ``(?:`` and a named group ``(?P<node>`` become ``(``, ``\\d`` becomes ``[0-9]``,
and look-ahead and look-behind groups, which ERE lacks, are dropped (grep then searches a superset).
``\\t`` and ``\\r`` become the characters themselves (a bracket expression in ERE has no escapes:
``[^"\\n]`` would also exclude a backslash and an ``n``), and ``\\n`` in a bracket expression is
dropped: grep searches line by line, so no line holds a newline to match or exclude. An escaped
``\\]`` in a class moves to the class's front, the one place a bracket expression takes it literally.
"""

from __future__ import annotations

import re

from kcover.classify.rules import Rule

_CLASS_ESCAPES = {"d": "[0-9]", "D": "[^0-9]"}
_CONTROL_ESCAPES = {"t": "\t", "r": "\r"}
NAMED_GROUP = re.compile(r"\(\?P<\w+>")
"""The opening of a named group, (?P<node>: both baselines spell it as a plain group."""


def skip_group(pattern: str, start: int) -> int:
    """Index just past the group that opens at ``start`` (balanced parentheses, escapes and classes skipped)."""
    depth = 0
    index = start
    in_class = False
    while index < len(pattern):
        char = pattern[index]
        if char == "\\":
            index += 2
            continue
        if in_class:
            in_class = char != "]"
        elif char == "[":
            in_class = True
        elif char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth == 0:
                return index + 1
        index += 1
    return index


def _escape(pattern: str, index: int, in_class: bool, ignore_case: bool, class_so_far: list[str]) -> str:
    """The ERE form of the escape ``pattern[index:index + 2]`` (``in_class``: inside a bracket expression,
    ``class_so_far``: the last two pieces written)."""
    nxt = pattern[index + 1]
    if nxt in _CLASS_ESCAPES and not in_class:
        return _CLASS_ESCAPES[nxt]
    if nxt == "d" and in_class:
        return "0-9"
    if nxt in "-\"'" or (nxt == "[" and in_class):
        return nxt
    if nxt in _CONTROL_ESCAPES:
        return _CONTROL_ESCAPES[nxt]
    if nxt == "n" and in_class:
        empty_so_far = class_so_far[-1:] == ["["] or class_so_far == ["[", "^"]
        if empty_so_far and pattern.startswith("]", index + 2):
            raise ValueError(f"a bracket expression of only \\n has no ERE form: {pattern!r}")
        return ""
    if nxt == "s" and in_class:
        return "[:space:]"
    if nxt == "w" and in_class:
        return "[:alnum:]_"
    if nxt.isalpha() and ignore_case and nxt not in "bBsSwW" and not in_class:
        return f"\\{nxt}"
    return "\\" + nxt


def to_ere(pattern: str, ignore_case: bool) -> str:
    out: list[str] = []
    index = 0
    in_class = False
    class_open = 0
    while index < len(pattern):
        char = pattern[index]
        if char == "\\" and pattern.startswith("]", index + 1) and in_class:
            # a bracket expression has no escapes: a ] is literal only first (after a ^)
            out.insert(class_open + 1 + (out[class_open + 1 : class_open + 2] == ["^"]), "]")
            index += 2
            continue
        if char == "\\" and index + 1 < len(pattern):
            piece = _escape(pattern, index, in_class, ignore_case, out[-2:])
            if piece:  # \n in a bracket expression is dropped
                out.append(piece)
            index += 2
            continue
        if not in_class and pattern.startswith("(?:", index):
            out.append("(")
            index += 3
            continue
        named = None if in_class else NAMED_GROUP.match(pattern, index)
        if named:
            out.append("(")
            index = named.end()
            continue
        if not in_class and pattern.startswith(("(?!", "(?<!", "(?<=", "(?="), index):
            index = skip_group(pattern, index)
            continue
        if char == "[" and not in_class:
            in_class = True
            class_open = len(out)
        elif char == "]" and in_class and out and out[-1] != "[":
            in_class = False
        if ignore_case and char.isalpha():
            if in_class:
                out.append(char.lower() + char.upper())
            else:
                out.append(f"[{char.lower()}{char.upper()}]")
        else:
            out.append(char)
        index += 1
    return "".join(out)


def catalog_to_ere(rules: list[Rule]) -> list[str]:
    return [to_ere(p, r.spec.ignore_case) for r in rules for p in r.spec.patterns]
