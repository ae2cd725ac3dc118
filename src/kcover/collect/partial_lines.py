"""Joining the pieces of a container log line that the runtime cut.

A container runtime writes a line longer than 16 KiB (containerd, CRI-O) as
several records of the kubelet's log format: every piece but the last tagged
``P`` (partial), the last ``F``.  Docker's ``json-file`` cuts such lines too,
and :func:`~kcover.collect.lines.docker_json_to_cri` tags its pieces ``P``.
Read record by record, a pattern that spans a cut goes unmatched, and the last
piece, the line a log ends with, is the tail of a message without its head (an
exception's ``RuntimeError:`` sits in the first piece).

:func:`join_partial_lines` puts each cut line together again, on the line of
its last piece, and leaves the lines of its earlier pieces blank: line numbers
stay the file's, and a line of the other stream written between the pieces
keeps its place.  A joined line stops growing at
:data:`~kcover.collect.lines.MAX_LINE_BYTES` (what is read past that starts a
new line, as an uncut line that long would be cut).  :func:`unfinished_at`
says where the pieces of a line whose last piece is not read yet begin:
readers hold those bytes back for the next read (:func:`join_partial_blocks`,
the node agent's tailer), and a log that ends in pieces (containerd writes the
last words of a container that died mid-line as ``P``) gives them as they are.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

from kcover.collect.lines import MAX_LINE_BYTES

_RECORD = re.compile(rb"^\d{4}-\d\d-\d\dT[\d:.]+(?:Z|[+-]\d\d:\d\d) (stdout|stderr) ([FP])(?: |$)")
_PIECE_MARKS = (b"out P ", b"err P ")
MAX_HELD_BYTES = 4 * MAX_LINE_BYTES
"""Bytes held back waiting for a line's last piece, other lines between its pieces included."""


_ANY_RECORD = re.compile(rb"(?m)^\d{4}-\d\d-\d\dT[\d:.]+(?:Z|[+-]\d\d:\d\d) std(?:out|err) [FP]")
LOOK_BYTES = 4096
"""Bytes at each end of a block looked at for a record: a block with none there is no container log."""


def _has_pieces(block: bytes) -> bool:
    """Whether ``block`` may hold pieces: a container log's records near its ends, and a ``P`` tag.

    Looking for the tags alone costs a third of a scan of a log that is no
    container log (two substring searches of every block): a record near the
    block's ends is looked for first, in microseconds.
    """
    if _ANY_RECORD.search(block, 0, LOOK_BYTES) is None and \
            _ANY_RECORD.search(block, max(0, len(block) - LOOK_BYTES)) is None:
        return False
    return any(mark in block for mark in _PIECE_MARKS)


def unfinished_at(block: bytes) -> int | None:
    """Where the first piece of a cut line whose last piece is not in ``block`` begins; None when there is none.

    A last line without its line break is no record yet (a read may end
    inside one).  A line finished after that point whose pieces began before
    it moves the point back to its first piece: a cut line is never split
    between what is given and what waits.
    """
    if not _has_pieces(block):
        return None
    started: dict[bytes, int] = {}  # stream -> where its unfinished pieces begin
    sizes: dict[bytes, int] = {}
    finished: list[tuple[int, int]] = []  # (first piece, last piece) of every joined line
    at = 0
    lines = block.split(b"\n")
    for line in lines[:-1]:  # the part after the last line break is not a whole record
        record = _RECORD.match(line)
        if record is not None:
            stream, tag = record.group(1), record.group(2)
            if tag == b"P":
                first = started.setdefault(stream, at)
                sizes[stream] = sizes.get(stream, 0) + len(line) - record.end()
                if sizes[stream] >= MAX_LINE_BYTES:  # joined, it is given here: nothing waits
                    finished.append((first, at))
                    del started[stream], sizes[stream]
            elif stream in started:
                finished.append((started.pop(stream), at))
                sizes.pop(stream, None)
        at += len(line) + 1
    cut = min(started.values(), default=None)
    if cut is None:
        return None
    for first, last in sorted(finished, reverse=True):  # latest first: a move back can reach an earlier one
        if first < cut <= last:
            cut = first
    return cut


def join_partial_lines(block: bytes) -> bytes:
    """``block`` with each cut line whole on its last piece's line, its earlier pieces' lines blank.

    Pieces whose last piece is not in ``block`` are left as they are.  The
    same number of line breaks comes out as went in.  A line without a record
    header after a record is the rest of that record that a carriage return
    split off (a progress bar redrawn in place): a piece ends on its last such
    line, and that is what the next piece continues.
    """
    if not _has_pieces(block):
        return block
    lines = block.split(b"\n")
    original = list(lines)
    ends: dict[bytes, int] = {}  # stream -> the line its waiting pieces end on so far
    sizes: dict[bytes, int] = {}
    touched: dict[bytes, list[int]] = {}  # stream -> lines changed for its waiting pieces
    last_stream: bytes | None = None  # the stream of the latest record: a line without a header is its
    for index, line in enumerate(lines):
        record = _RECORD.match(line)
        if record is None:
            if last_stream in ends and line:
                ends[last_stream] = index  # split off by a carriage return: the piece now ends here
            continue
        stream, tag = record.group(1), record.group(2)
        last_stream = stream
        if stream in ends:  # this record's text continues the previous piece's last line
            end = ends[stream]
            carried = lines[end][record_end(lines[end]) :]
            lines[end] = b""
            tagged = line[: record.start(2)] + b"F" + line[record.start(2) + 1 : record.end()]
            lines[index] = tagged + carried + line[record.end() :]
            touched.setdefault(stream, []).extend((end, index))
        if tag == b"P":
            ends[stream] = index
            sizes[stream] = sizes.get(stream, 0) + len(line) - record.end()
            if sizes[stream] >= MAX_LINE_BYTES:  # as long as a line may be: given here
                del ends[stream], sizes[stream]
                touched.pop(stream, None)
        else:
            ends.pop(stream, None)
            sizes.pop(stream, None)
            touched.pop(stream, None)
    for stream in ends:  # not finished in this block: as they were
        for index in touched.get(stream, ()):
            lines[index] = original[index]
    return b"\n".join(lines)


def record_end(line: bytes) -> int:
    """Where a line's text begins after its record header (0 for a line split off by a carriage return)."""
    record = _RECORD.match(line)
    return record.end() if record else 0


def join_partial_blocks(blocks: Iterable[bytes]) -> Iterator[bytes]:
    """Blocks of whole lines with every cut line joined, pieces that span blocks included.

    The pieces of a line not finished at a block's end, and what follows
    them, wait for the next block (at most :data:`MAX_HELD_BYTES`); the last
    block's unfinished pieces come as they are.
    """
    held = b""
    for read in blocks:
        block = held + read if held else read
        at = unfinished_at(block)
        if at is not None and len(block) - at <= MAX_HELD_BYTES:
            held, block = block[at:], block[:at]
        else:
            held = b""
        if block:
            yield join_partial_lines(block)
    if held:
        yield join_partial_lines(held)
