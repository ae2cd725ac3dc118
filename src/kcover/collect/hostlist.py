"""The nodes a scheduler names in one word: Slurm host lists and comma-separated node lists.

Slurm writes a set of nodes as a host list: ``gpu-[01-03,07]`` is gpu-01, gpu-02,
gpu-03 and gpu-07 (a range keeps the width of its first number), several
bracketed parts multiply (``rack[1-2]-n[1-2]``), and commas join lists
(``gpu-[01-02],cpu-7``); Kueue joins node names with commas.  :func:`expand`
turns such a word into the names it stands for, so a line reporting that these
nodes failed blames each of them.  A word that is not a valid list, or stands
for more than :data:`MAX_NODES` nodes (a whole partition is no node to exclude),
names none.
"""

from __future__ import annotations

import re

MAX_NODES = 64
MAX_NAME = 253
"""A host name's most characters (RFC 1123): a list expanding to longer names is no host list."""
_RANGES = re.compile(r"\[([0-9]{1,12}(?:-[0-9]{1,12})?(?:,[0-9]{1,12}(?:-[0-9]{1,12})?){0,63})\]")
_NAME = re.compile(rf"[A-Za-z0-9_.\-]{{1,{MAX_NAME}}}")


def expand(word: str) -> tuple[str, ...]:
    """The node names ``word`` stands for, in order and without repeats; none for an invalid or long list."""
    names: list[str] = []
    for item in _top_level_items(word):
        expanded = _expand_item(item)
        if not expanded or any(len(name) > MAX_NAME for name in expanded):
            return ()
        names.extend(expanded)
        if len(names) > MAX_NODES:
            return ()
    return tuple(dict.fromkeys(names))


def _top_level_items(word: str) -> list[str]:
    """``word`` split at the commas outside brackets."""
    items, depth, start = [], 0, 0
    for index, char in enumerate(word):
        depth += (char == "[") - (char == "]")
        if char == "," and depth == 0:
            items.append(word[start:index])
            start = index + 1
    items.append(word[start:])
    return items


def _expand_item(item: str) -> list[str]:
    """One host list without top-level commas, expanded; empty when it is not a valid one."""
    found = _RANGES.search(item)
    if found is None:
        return [item] if _NAME.fullmatch(item) else []
    head, tail = item[: found.start()], item[found.end() :]
    if head and not _NAME.fullmatch(head):
        return []
    numbers = _numbers(found.group(1))
    tails = _expand_item(tail) if tail else [""]
    if not numbers or not tails or len(numbers) * len(tails) > MAX_NODES:
        return []
    return [head + number + rest for number in numbers for rest in tails]


def _numbers(ranges: str) -> list[str]:
    """``01-03,07`` as ``["01", "02", "03", "07"]`` (each range as wide as its first number)."""
    numbers: list[str] = []
    for part in ranges.split(","):
        low, _, high = part.partition("-")
        first, last = int(low), int(high or low)
        if last < first or last - first >= MAX_NODES or len(numbers) + last - first >= MAX_NODES:
            return []
        numbers.extend(str(value).zfill(len(low)) for value in range(first, last + 1))
    return numbers
