"""Slurm's task labels (``srun --label``), read once per log rather than per line.

``srun --label`` (``-l``) writes the task's number before every line a task
prints, padded to the width of the largest task number (``%*d: ``, Slurm's
``write_labelled_message.c``; ``P1  3: `` for a component of a heterogeneous
job), and the task number is the rank a training script reads from
``SLURM_PROCID``.  The same shape, a number and ``: ``, is also what programs
print themselves (a sysfs port state reads ``1: DOWN``, ``ip addr`` numbers its
links, ``/proc/interrupts`` its lines), so one line alone cannot say which it
is, and :mod:`kcover.collect.prefixes` does not read it.

A whole log can.  Its first :data:`DECIDING_LINES` lines with something on
them decide: the log is labelled when
at least :data:`MIN_LABELLED_SHARE` of them start with such a number, the
colon stands in the same column on each (the padding), and one number labels
two lines or more (a task prints several lines; a numbered listing, a link or
an interrupt table numbers each line once).  Then each labelled line's label
is written as PyTorch's rank tag (``[rank3]: ``), which every later reading
of the line knows; lines without one (``srun: error: …``, srun's own) pass
unchanged, and so does every block of a log that is not labelled.  A one-line
log is never labelled: it cannot show a number used twice.

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
_ANY_LABEL = re.compile(rb"(P\d{1,5} )?( {0,7}\d{1,7}): ")
"""A task label at a line's start, with the heterogeneous job's component; group 2 is the padded number."""
_NOT_BLANK = re.compile(rb"(?m)^[ \t]*[^ \t\n]")


def _label_width(block: bytes) -> int | None:
    """The padded width of the task labels of a labelled log's head, or ``None`` if it is not labelled."""
    lines = [line for line in block.split(b"\n") if _NOT_BLANK.match(line)][:DECIDING_LINES]
    labels = [found for line in lines if (found := _ANY_LABEL.match(line))]
    if len(labels) < 2 or len(labels) < MIN_LABELLED_SHARE * len(lines):
        return None
    widths = {len(found.group(2)) for found in labels}
    if len(widths) != 1:
        return None
    numbers = Counter(int(found.group(2)) for found in labels)
    return widths.pop() if numbers.most_common(1)[0][1] >= 2 else None


def _relabel(width: int) -> re.Pattern[bytes]:
    """A label of exactly ``width`` padded characters at any line's start."""
    return re.compile(rb"(?m)^(?:P\d{1,5} )?(?=[ \d]{%d}: ) {0,%d}(\d{1,%d}): " % (width, width - 1, width))


def read_task_labels(blocks: Iterable[bytes]) -> Iterator[bytes]:
    """The blocks of a log, each task label written as a rank tag when the log is ``srun --label``'s.

    Blocks are held back only until :data:`DECIDING_BYTES` have arrived (or the log ends), so a log
    that arrives in small pieces is decided on its first lines, not on its first piece.
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
        yield label.sub(rb"[rank\1]: ", block) if label else block
