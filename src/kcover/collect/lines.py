"""Turning raw log bytes into clean blocks and lines, whatever the input looks like.

Logs arrive as bytes of any quality: CRLF endings, ``\\r`` progress bars, ANSI
colour codes, NUL bytes, invalid UTF-8, lines of 100 MB, CRI container-log
prefixes, launcher prefixes such as ``[rank3]:``.  :func:`read_blocks` yields
blocks of whole lines (about 1 MiB each) with carriage returns turned into line
breaks and colour codes and NULs removed, so patterns see the text a person
would see; a line longer than :data:`MAX_LINE_BYTES` is cut into pieces so
memory stays bounded.  :func:`parse_line` decodes one line and lifts out what
it says about itself: timestamp, rank, host.

Used by the scanner for files, pipes and live worker output alike.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol

from kcover.collect.prefixes import LAUNCHER_TAG, next_prefix
from kcover.collect.task_labels import MARKED_LABEL


class ByteStream(Protocol):
    """What the readers need of a log: ``read(size)`` giving bytes, ``b""`` at its end (file, pipe, decompressor)."""

    def read(self, size: int = -1, /) -> bytes: ...


BLOCK_BYTES = 1 << 20
MAX_LINE_BYTES = 1 << 20
EVIDENCE_CHARS = 2000
SHAPE_CHARS = 500
"""Characters of a line that decide whether two lines are repeats of one another (see :func:`line_shape`)."""

_ANSI = re.compile(rb"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])")
_DOCKER_JSON = b'{"log":"'
_WEB_TYPOGRAPHY = tuple(
    (typographic.encode(), plain)
    for typographic, plain in (("\u2018", b"'"), ("\u2019", b"'"), ("\u201c", b'"'), ("\u201d", b'"'),
                               ("\u00a0", b" "), ("\u202f", b" "))
)
"""Typographic quotes and no-break spaces a web page puts into copied text, and what the program wrote."""
_LONE_CR = re.compile(rb"\r(?!\n)")
_CRI = re.compile(r"^(\d{4}-\d\d-\d\dT[\d:.]+(?:Z|[+-]\d\d:\d\d)) (?:stdout|stderr) [FP] ?")
_TIMESTAMP = re.compile(
    r"^\[?(\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?)\]?"
    r"|^\[\s*(\d+\.\d+)\]"
)
_MAX_PREFIXES = 8
_NCCL_HOST = re.compile(r"(?:^|\s)([A-Za-z0-9][\w.\-]*):\d+:\d+ \[\d+\] NCCL")
_DIGITS = re.compile(r"\d+")
_RANK_IN_TEXT = re.compile(r"\[(?:PG [^\]]*?)?Rank (\d+)\]|\brank[ =:]\s?(\d+)\b", re.IGNORECASE)


def clean_block(block: bytes) -> bytes:
    """Normalise line breaks and drop colour codes and NULs (cheap when absent).

    Docker's ``json-file`` lines are unwrapped first (:func:`docker_json_to_cri`).
    A log copied from a web page (a forum post, a rendered issue) may carry
    typographic quotes and no-break spaces where the program wrote ``'``, ``"``
    and spaces: they are turned back (:data:`_WEB_TYPOGRAPHY`), so a pattern
    with a quote or a space still matches.
    """
    if _DOCKER_JSON in block:
        block = docker_json_to_cri(block)
    if b"\r" in block:
        block = unify_line_breaks(block)
    if b"\x1b" in block:
        block = _ANSI.sub(b"", block)
    if b"\x00" in block:
        block = block.replace(b"\x00", b"")
    if b"\xe2\x80" in block or b"\xc2\xa0" in block:
        for typographic, plain in _WEB_TYPOGRAPHY:
            block = block.replace(typographic, plain)
    return block


def docker_json_to_cri(block: bytes) -> bytes:
    """Docker's ``json-file`` log lines turned into the CRI lines they stand for.

    Where Docker runs the containers (``cri-dockerd``), a pod's log file is
    Docker's: one JSON object per line, ``{"log":"…\\n","stream":"stderr",
    "time":"…"}``, its text escaped (``\\"``, ``\\t``, ``\\u001b``), so patterns
    would miss what a person sees.  Each such line becomes ``<time> <stream>
    F <text>`` (``P`` for a line Docker cut), which :func:`parse_line` reads like
    any CRI line; a line that is not such an object is left as it is.
    """
    lines = block.split(b"\n")
    for index, line in enumerate(lines):
        if line.startswith(_DOCKER_JSON):
            lines[index] = _docker_line(line)
    return b"\n".join(lines)


def _docker_line(line: bytes) -> bytes:
    try:
        entry = json.loads(line)
    except ValueError:
        return line
    if not isinstance(entry, dict) or not isinstance(entry.get("log"), str):
        return line
    text: str = entry["log"]
    stream = entry.get("stream") if entry.get("stream") in ("stdout", "stderr") else "stdout"
    tag = "F" if text.endswith("\n") else "P"
    time = entry.get("time")
    head = f"{time} {stream} {tag} " if isinstance(time, str) and _CRI.match(f"{time} {stream} {tag} ") else ""
    return (head + text.removesuffix("\n")).encode("utf-8", errors="surrogatepass")


def unify_line_breaks(block: bytes) -> bytes:
    """Every ``\\r\\n`` and every other ``\\r`` turned into one ``\\n``.

    The same bytes as ``block.replace(b"\\r\\n", b"\\n").replace(b"\\r", b"\\n")``,
    but a two-byte ``replace`` takes CPython's slow general path, about 2.5 ms
    a megabyte, a quarter of a scan.  When every ``\\r`` is the first half of a
    CRLF (Windows line ends, a ``print`` after a ``tqdm`` bar) deleting them is
    the same thing, and deleting one byte value runs at memory speed; the search
    for a lone ``\\r`` stops at the first one.  Without any CRLF (a ``tqdm`` bar
    redrawn in place) every ``\\r`` becomes a ``\\n``, again at memory speed; only
    a block holding both takes the general path.
    """
    if _LONE_CR.search(block) is None:
        return block.replace(b"\r", b"")
    if b"\r\n" not in block:
        return block.replace(b"\r", b"\n")
    return block.replace(b"\r\n", b"\n").replace(b"\r", b"\n")


def last_line_break(data: bytes) -> int:
    """Index of the last line break in ``data`` (-1 if none); a trailing ``\r`` waits, as its ``\n`` may follow."""
    end = len(data) - 1 if data.endswith(b"\r") else len(data)
    return max(data.rfind(b"\n", 0, end), data.rfind(b"\r", 0, end))


def read_blocks(stream: ByteStream, block_bytes: int = BLOCK_BYTES) -> Iterator[bytes]:
    """Yield cleaned blocks that end on a line break (the last one may not).

    A line longer than :data:`MAX_LINE_BYTES` is yielded in pieces, each ending
    with an added line break, so no single line is ever held whole in memory.
    """
    carry = b""
    while True:
        data = stream.read(block_bytes)
        if not data:
            break
        data = carry + data
        cut = last_line_break(data)
        if cut < 0:
            if len(data) >= MAX_LINE_BYTES:
                yield clean_block(data[:MAX_LINE_BYTES]) + b"\n"
                carry = data[MAX_LINE_BYTES:]
            else:
                carry = data
            continue
        carry = data[cut + 1 :]
        yield clean_block(data[: cut + 1])
    if carry:
        yield clean_block(carry)


_FLUSH_LINE = re.compile(rb"(?m)^(?=[^ \t\n\r\f\v])")
"""A line that starts flush left with something on it."""
_LEADING = re.compile(rb"(?m)^([ \t]+)(?=[^ \t\n\r\f\v])")
"""The leading spaces and tabs of a line with something after them (blank lines have no say)."""


def _shared_prefix(items: list[bytes]) -> bytes:
    """The longest start every item has (b"" for none)."""
    if not items:
        return b""
    low, high = min(items), max(items)
    size = next((index for index, (a, b) in enumerate(zip(low, high, strict=False)) if a != b), len(low))
    return low[:size]


def _first_line_lacking(block: bytes, indent: bytes) -> re.Match[bytes] | None:
    """The start of the first line of ``block`` with something on it that does not begin with ``indent``."""
    breaks = block.count(b"\n") - block.endswith(b"\n")  # the breaks a line follows, in this block
    if block.startswith(indent) and block.count(b"\n" + indent) == breaks:
        return None  # every line has it: counted in C, the common case of a long indented paste
    return re.search(rb"(?m)^(?!" + re.escape(indent) + rb")(?=[ \t]*[^ \t\n\r\f\v])", block)


def dedent_blocks(blocks: Iterable[bytes]) -> Iterator[bytes]:
    """The blocks of a log pasted as an indented block, without the indentation its lines share.

    A log copied from an issue thread or a mail is often indented as a whole,
    and indentation is how a traceback's frames and code are told from its
    exception line.  The first block that is not blank decides: when every line
    of it is indented, the indentation they all share is taken off each line,
    narrowed where a later block's line is indented by a part of it, up to the
    first line indented otherwise or not at all (the paste ended there; the rest
    is left as it is).  When any line of it starts flush left, as a
    program writes its log (a tail may begin inside a traceback's frames, whose
    indentation must stay), nothing is ever changed and the blocks pass through
    as they are.  Only ``kcover explain`` reads pasted logs: the launcher and
    the agent read programs' output as it is.
    """
    indent: bytes | None = None
    for block in blocks:
        if indent is None and block.strip():
            indent = b"" if _FLUSH_LINE.search(block) else _shared_prefix(_LEADING.findall(block))
        if not indent:
            yield block
            continue
        pieces: list[bytes] = []
        rest = block
        while indent:
            lacking = _first_line_lacking(rest, indent)
            head, rest = (rest[: lacking.start()], rest[lacking.start() :]) if lacking else (rest, b"")
            body = head.replace(b"\n" + indent, b"\n")  # every line of it that is not blank has the indentation
            pieces.append(body[len(indent) :] if body.startswith(indent) else body)
            if not lacking:
                break
            leading = rest[: len(rest) - len(rest.lstrip(b" \t"))]
            # indented by a part of it (the block's first lines were more indented): narrow; else the paste ended
            indent = leading if indent.startswith(leading) else b""
        yield b"".join(pieces) + rest


@dataclass(frozen=True)
class LogLine:
    """One decoded line and what it says about where it came from."""

    text: str
    timestamp: str | None = None
    rank: int | None = None
    node: str | None = None
    message_at: int = 0
    """Where the message begins in ``text``, after quote marks, rank tags and timestamps."""
    rank_in_text: bool = False
    """The rank was read from the message's words (``[PG ID 2 … Rank 1]``), not from a tag or prefix."""

    @property
    def message(self) -> str:
        """The line from its message on: what a rule anchored at a message's start reads."""
        return self.text[self.message_at :]


def parse_line(raw: bytes) -> LogLine:
    """Decode a line and strip CRI and launcher prefixes, keeping what they tell.

    The message's start is found past further prefixes, in any order and
    nesting (:mod:`kcover.collect.prefixes`): rank tags, leading timestamps,
    quote marks of a log pasted into an issue, the worker's name that a
    launcher or log aggregator puts before its lines, so a rule anchored at
    the start of a message (a Python exception line) sees it there; the rank
    and node they tell are kept.  A logger's level stays in the message.
    Indentation is kept: it tells a traceback's code from its error.
    """
    text = raw.decode("utf-8", errors="replace").rstrip()  # trailing blanks are no part of a message
    timestamp = None
    rank = None
    srun = MARKED_LABEL.match(text)  # srun --label's task number, marked when the whole log was read as labelled
    if srun:
        rank = int(srun.group(1))
        text = text[srun.end() :]
    cri = _CRI.match(text)
    if cri:
        timestamp = cri.group(1)
        text = text[cri.end() :]
    launcher = LAUNCHER_TAG.match(text)
    if launcher:
        found = launcher.group("rank") or launcher.group("mpi")
        rank = int(found) if found and rank is None else rank
        text = text[launcher.end() :]
    message_at = 0
    node = None
    for _ in range(_MAX_PREFIXES):
        prefix = next_prefix(text, message_at)
        if prefix is None:
            break
        rank = prefix.rank if rank is None else rank
        node = node or prefix.node
        timestamp = timestamp or prefix.timestamp
        message_at = prefix.end
    if timestamp is None:
        stamp = _TIMESTAMP.match(text)
        if stamp:
            timestamp = stamp.group(1) or stamp.group(2)
    in_text = _RANK_IN_TEXT.search(text) if rank is None else None
    if in_text:
        rank = int(in_text.group(1) or in_text.group(2))
    host = _NCCL_HOST.search(text)
    return LogLine(
        text=text, timestamp=timestamp, rank=rank, node=node or (host.group(1) if host else None),
        message_at=message_at, rank_in_text=in_text is not None,
    )


def evidence_text(text: str, around: int | None = None) -> str:
    """The line as kept in evidence: whole when short, else a window around ``around``."""
    if len(text) <= EVIDENCE_CHARS:
        return text
    centre = around if around is not None else 0
    start = max(0, min(centre - EVIDENCE_CHARS // 2, len(text) - EVIDENCE_CHARS))
    return f"…{text[start : start + EVIDENCE_CHARS]}… [{len(text)} chars]"


def line_shape(text: str) -> str:
    """A line with its numbers masked, cut to :data:`SHAPE_CHARS`: equal shapes are repeats of one fault.

    Used to count a flood of near-identical lines (timestamps, pids, addresses
    differ) as one fault, by the collector and by the node agent alike.
    """
    return _DIGITS.sub("#", text[:SHAPE_CHARS])
