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

_RECORD = re.compile(rb"^\d{4}-\d\d-\d\dT[\d:.]+(?:Z|[+-]\d\d:\d\d) (stdout|stderr) ([FP]) ?")
_PIECE_MARKS = (b"out P ", b"err P ")
MAX_HELD_BYTES = 4 * MAX_LINE_BYTES
"""Bytes held back waiting for a line's last piece, other lines between its pieces included."""


def _has_pieces(block: bytes) -> bool:
    return any(mark in block for mark in _PIECE_MARKS)


def unfinished_at(block: bytes) -> int | None:
    """Where the first piece of a cut line whose last piece is not in ``block`` begins; None when there is none."""
    if not _has_pieces(block):
        return None
    started: dict[bytes, int] = {}  # stream -> where its unfinished pieces begin
    sizes: dict[bytes, int] = {}
    at = 0
    for line in block.split(b"\n"):
        record = _RECORD.match(line)
        if record is not None:
            stream, tag = record.group(1), record.group(2)
            if tag == b"P":
                started.setdefault(stream, at)
                sizes[stream] = sizes.get(stream, 0) + len(line) - record.end()
                if sizes[stream] >= MAX_LINE_BYTES:  # joined, it is given here: nothing waits
                    del started[stream], sizes[stream]
            else:
                started.pop(stream, None)
                sizes.pop(stream, None)
        at += len(line) + 1
    return min(started.values(), default=None)


def join_partial_lines(block: bytes) -> bytes:
    """``block`` with each cut line whole on its last piece's line, its earlier pieces' lines blank.

    Pieces whose last piece is not in ``block`` are left as they are.  The
    same number of line breaks comes out as went in.
    """
    if not _has_pieces(block):
        return block
    lines = block.split(b"\n")
    pieces: dict[bytes, list[int]] = {}  # stream -> the indexes of its waiting pieces
    sizes: dict[bytes, int] = {}
    starts: dict[int, tuple[int, int]] = {}  # index of a piece -> where its tag and its text start
    for index, line in enumerate(lines):
        record = _RECORD.match(line)
        if record is None:
            continue
        stream, tag = record.group(1), record.group(2)
        if tag == b"F" and stream not in pieces:
            continue
        waiting = pieces.setdefault(stream, [])
        waiting.append(index)
        starts[index] = (record.start(2), record.end())
        sizes[stream] = sizes.get(stream, 0) + len(line) - record.end()
        if tag == b"F" or sizes[stream] >= MAX_LINE_BYTES:
            _join(lines, waiting, starts)
            del pieces[stream], sizes[stream]
    return b"\n".join(lines)


def _join(lines: list[bytes], waiting: list[int], starts: dict[int, tuple[int, int]]) -> None:
    """The pieces at ``waiting`` joined on the last one's line, tagged ``F``; the others' lines left blank."""
    last = waiting[-1]
    tag_at, text_at = starts[last]
    head = lines[last][:tag_at] + b"F" + lines[last][tag_at + 1 : text_at]
    text = b"".join(lines[index][starts[index][1] :] for index in waiting)
    for index in waiting[:-1]:
        lines[index] = b""
    lines[last] = head + text


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
