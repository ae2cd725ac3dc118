"""Slurm's task labels (``srun --label``), read once per log rather than per line.

``srun --label`` (``-l``) writes the task's number before every line a task
prints, padded to the width of the largest task number (``%*d: ``, Slurm's
``write_labelled_message.c``), and the task number is the rank a training
script reads from ``SLURM_PROCID``.  The same shape, a number and ``: ``, is
also what programs print themselves (a sysfs port state reads ``1: DOWN``,
``ip -o addr`` numbers its links, ``/proc/interrupts`` its lines), so one line
alone cannot say which it is, and :mod:`kcover.collect.prefixes` does not read
it.

A whole log can.  Its first :data:`DECIDING_LINES` lines with something on
them decide: the log is labelled when at least :data:`MIN_LABELLED_SHARE` of
them start with such a number, the colon stands in the same column on each
(the padding), some labelled line says more than one word (a table of values,
``4: ACTIVE``, is no task's output), and either one number labels two lines
(a task prints several) or one message follows two numbers (every task prints
the same error); a numbered listing or an interrupt table numbers each of its
different lines once.  Then each label of that width is marked with a byte
no log holds (:data:`MARK`), and :func:`~kcover.collect.lines.parse_line`
reads a marked label as the line's rank and takes it off; lines
without one (``srun: error: …``, srun's own) pass unchanged, and so does every
block of a log that is not labelled.  A one-line log is never labelled.

Not read: a heterogeneous job's ``P1  3: `` (its number counts within its
component, so two components would share ranks), labels behind another
prefix (a CRI time, a quote mark), and a log whose first lines are mostly
something else (a long ``set -x`` header).  A log that numbers its lines with a
process id (``%(process)d: ``) or a link's index (``ip -o addr``) reads as
labelled, the number as its rank: no category changes with a rank.

Only ``kcover explain`` reads pasted and collected logs this way; the launcher
knows each worker's rank without it.
"""

from __future__ import annotations

import itertools
import re
from collections import Counter
from collections.abc import Iterable, Iterator

DECIDING_LINES = 256
"""Lines with something on them that decide whether a log is labelled."""
DECIDING_BYTES = 64 << 10
"""Bytes of a log's head read to decide (at most)."""
MIN_LABELLED_SHARE = 0.6
"""Share of the deciding lines that must carry a label (the rest: srun's own lines, a script's output before it)."""
_ANY_LABEL = re.compile(rb"( {0,7}\d{1,7}): (.*)")
"""A task label at a line's start (group 1: the padded number) and the line's message (group 2)."""
_NOT_BLANK = re.compile(rb"[ \t]*[^ \t]")
MARK = b"\x00"
"""Put before each label of a labelled log: a byte no cleaned block holds (:func:`~kcover.collect.lines.clean_block`
drops NULs), so only a label read here carries it; inserting one byte per line is the cheapest rewrite."""
MARKED_LABEL = re.compile(r"\x00 {0,7}(\d{1,7}): ")
"""A marked label at the start of a decoded line: group 1 is the task number, the line's rank."""


def _label_width(head: bytes) -> int | None:
    """The padded width of the task labels of a labelled log's head, or ``None`` if it is not labelled."""
    lines = [line for line in head.split(b"\n") if _NOT_BLANK.match(line)][:DECIDING_LINES]
    labels = [found for line in lines if (found := _ANY_LABEL.match(line))]
    if len(labels) < 2 or len(labels) < MIN_LABELLED_SHARE * len(lines):
        return None
    widths = {len(found.group(1)) for found in labels}
    if len(widths) != 1 or not any(b" " in found.group(2).strip() for found in labels):
        return None
    numbers = Counter(int(found.group(1)) for found in labels)
    said_by: dict[bytes, set[int]] = {}
    for found in labels:
        said_by.setdefault(found.group(2).strip(), set()).add(int(found.group(1)))
    repeated = numbers.most_common(1)[0][1] >= 2 or any(len(said) >= 2 for said in said_by.values())
    return widths.pop() if repeated else None


def _relabel(width: int) -> re.Pattern[bytes]:
    """The line break before a label of exactly ``width`` characters: blanks, then digits, then ``: ``.

    Starting at the line break lets the regex engine jump from one line break to the next.
    """
    return re.compile(rb"\n(?=[ \d]{%d}: )(?= {0,%d}\d)" % (width, width - 1))


def read_task_labels(blocks: Iterable[bytes]) -> Iterator[bytes]:
    """The blocks of a log, each task label marked with :data:`MARK` when the log is ``srun --label``'s.

    Blocks are held back only until :data:`DECIDING_BYTES` have arrived (or the log ends), so a log
    that arrives in small pieces is decided on its first lines, not on its first piece.  Every block
    starts a line (:func:`~kcover.collect.lines.read_blocks`).
    """
    held: list[bytes] = []
    size = 0
    iterator = iter(blocks)
    for block in iterator:
        held.append(block)
        size += len(block)
        if size >= DECIDING_BYTES:
            break
    width = _label_width(b"".join(held)[:DECIDING_BYTES])
    label = _relabel(width) if width else None
    for block in itertools.chain(held, iterator):
        yield label.sub(b"\n" + MARK, b"\n" + block)[1:] if label else block
