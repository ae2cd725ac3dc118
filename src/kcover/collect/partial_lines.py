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
from itertools import chain

from kcover.collect.lines import MAX_LINE_BYTES

_STAMP = rb"\d{4}-\d\d-\d\dT[\d:.]+(?:Z|[+-]\d\d:\d\d)"
"""The time a record of the kubelet's log format starts with (RFC 3339, nanoseconds)."""
_RECORD = re.compile(rb"^" + _STAMP + rb" (stdout|stderr) ([FP])(?: |$)")
_ANY_RECORD = re.compile(rb"(?m)^" + _STAMP + rb" std(?:out|err) [FP]")
_PIECE_MARKS = (b"out P ", b"err P ")
MAX_HELD_BYTES = 4 * MAX_LINE_BYTES
"""Bytes held back waiting for a line's last piece, other lines between its pieces included."""
LOOK_BYTES = 65536
"""Bytes of a stream's first block looked at for a record: a stream with none there is no container log."""


def _has_pieces(block: bytes) -> bool:
    return any(mark in block for mark in _PIECE_MARKS)


def unfinished(block: bytes, since: int = 0) -> tuple[int, int] | None:
    """Where the first cut line whose last piece is not in ``block`` begins, and where to cut; None for none.

    Only cut lines whose first piece starts at ``since`` or later count (the
    agent gives earlier ones as they are).  A last line without its line
    break is no record yet (a read may end inside one).  The cut is that first
    piece, moved back to the first piece of any line finished after it that
    began before it: a cut line is never split between what is given and what
    waits.
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
    waiting = [first for first in started.values() if first >= since]
    if not waiting:
        return None
    cut = first_unfinished = min(waiting)
    for first, last in sorted(finished, reverse=True):  # latest first: a move back can reach an earlier one
        if first < cut <= last:
            cut = first
    return first_unfinished, cut


def unfinished_at(block: bytes) -> int | None:
    """Where to cut ``block`` so that no cut line is split (:func:`unfinished`); None when nothing waits."""
    found = unfinished(block)
    return found[1] if found else None


class _Chain:
    """The pieces of one stream's cut line read so far: texts not yet placed, and where they came from."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.size = 0
        self.anchor = -1
        """The line the latest part was taken from (blanked), where it goes back when a carriage return ends it."""
        self.head = b""
        """The record header of that line (b"" for a line a carriage return split off)."""
        self.touched: list[int] = []


def join_partial_lines(block: bytes) -> bytes:
    """``block`` with each cut line whole on its last piece's line, its earlier pieces' lines blank.

    Pieces whose last piece is not in ``block`` are left as they are.  The
    same number of line breaks comes out as went in.  A line without a record
    header after a record is the rest of that record that a carriage return
    split off (a progress bar redrawn in place): the segment before it is whole
    and goes back to its line, and the next piece continues the last segment.
    Linear in the block's size: the texts of a chain are joined once.
    """
    if not _has_pieces(block):
        return block
    lines = block.split(b"\n")
    original = list(lines)
    chains: dict[bytes, _Chain] = {}
    last_stream: bytes | None = None  # the stream of the latest record: a line without a header is its
    for index, line in enumerate(lines):
        record = _RECORD.match(line)
        if record is None:
            pieces = chains.get(last_stream) if last_stream is not None else None
            if pieces is not None and line:  # split off by a carriage return: what came before is whole
                lines[pieces.anchor] = pieces.head + b"".join(pieces.parts)
                pieces.parts, pieces.size, pieces.anchor, pieces.head = [line], len(line), index, b""
                lines[index] = b""
                pieces.touched.append(index)
            continue
        stream, tag = record.group(1), record.group(2)
        last_stream = stream
        text = line[record.end() :]
        head = line[: record.start(2)] + b"F" + line[record.start(2) + 1 : record.end()]
        pieces = chains.get(stream)
        if tag == b"F" and pieces is None:
            continue
        if pieces is None:
            pieces = chains[stream] = _Chain()
        pieces.parts.append(text)
        pieces.size += len(text)
        pieces.touched.append(index)
        if tag == b"F" or pieces.size >= MAX_LINE_BYTES:  # finished, or as long as a line may be: given here
            lines[index] = head + b"".join(pieces.parts)
            del chains[stream]
        else:
            lines[index] = b""
            pieces.anchor, pieces.head = index, line[: record.end()]
    for pieces in chains.values():  # not finished in this block: as they were
        for index in pieces.touched:
            lines[index] = original[index]
    return b"\n".join(lines)


def join_partial_blocks(blocks: Iterable[bytes]) -> Iterator[bytes]:
    """Blocks of whole lines with every cut line joined, pieces that span blocks included.

    A stream is taken for a container log when its first block has a record
    near its start; any other (a program's own output, a pasted log) passes
    through untouched, at no cost.  The pieces of a line not finished at a
    block's end, and what follows them, wait for the next block (at most
    :data:`MAX_HELD_BYTES`); the last block's unfinished pieces come as they
    are.
    """
    stream = iter(blocks)
    for first in stream:
        if not first.strip():
            yield first
            continue
        if _ANY_RECORD.search(first, 0, LOOK_BYTES) is None:
            yield first
            yield from stream
            return
        yield from _joined(first, stream)
        return


def _joined(first: bytes, rest: Iterator[bytes]) -> Iterator[bytes]:
    held = b""
    for read in chain((first,), rest):
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
