"""A node that offers fewer accelerators than it has: ``Allocatable`` below ``Capacity``.

A Kubernetes node reports each extended resource twice: ``capacity`` (what the
device plugin found) and ``allocatable`` (what it offers to pods).  For GPUs
the two differ when the device plugin has marked devices unhealthy: NVIDIA's
k8s-device-plugin does so on an Xid event or a lost device (its ``health.go``),
AMD's and Intel's plugins on their health checks.  ``kubectl describe node``
prints them as two blocks (``Capacity:`` then ``Allocatable:``), ``kubectl get
node -o yaml`` and ``-o json`` as two maps (``allocatable`` first), each with
a line such as ``nvidia.com/gpu: 8``; no single line says that a GPU is gone,
so no catalog pattern can.

This reader does: while a log streams past it keeps, per accelerator resource,
the last value seen in a capacity section and in an allocatable section, and when
the pair is complete and allocatable is below capacity it appends :data:`NOTE`
to the line that completed it, ``(kcover: allocatable nvidia.com/gpu 7 <
capacity 8)``, with ``node NAME: `` before ``allocatable`` when the
description gave the node's name, which the catalog's rules read like any other
text (``gpu.unallocatable`` for some GPUs gone, ``k8s.gpus-not-advertised`` for
none offered at all; both blame the node named).  A section ends at its first
line indented no deeper than its header, or :data:`MAX_SECTION_LINES` lines
after it.  Only sibling sections pair (headers at one indentation), each pair is
compared once, and a new node's name (``Name:``, ``metadata.name``) or a second
section of one kind forgets a count still waiting, so several nodes described
one after another are each compared with their own numbers, and a fragment (a
``grep -A4 Allocatable``) pairs with nothing after it.  Indentation is the
message's, past any prefix a launcher, a pod log or a paste put before the line
(:func:`~kcover.collect.lines.parse_line`).

Cheap on any log: most blocks of the stream get one substring search, for
``llocatable``: a pair needs an allocatable section, and a capacity section
before it stands in the same block or at the end of the one before (the last
:data:`TAIL_READ_BYTES` of a block passed over unread are kept, and read then;
a block read is never read again); a block that follows one with a section
still open or a count still unpaired is read too, then both are forgotten.  In
a block read, only the lines where a header word, a ``name`` key or an
accelerator's name stands before a colon are parsed, and the lines between a
header and a count (at most :data:`MAX_SECTION_LINES`).

Not read: one-line JSON (``-o jsonpath``) and ``Allocated resources:`` (what
pods use, not what the node offers).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from kcover.collect.lines import parse_line

ACCELERATORS = (
    r"nvidia\.com/(?:gpu(?:\.shared)?|mig-[\w.\-]{1,40})|amd\.com/gpu|gpu\.intel\.com/i915|gpu\.intel\.com/xe|habana\.ai/gaudi"
    r"|huawei\.com/Ascend\w{1,20}|aws\.amazon\.com/neuron(?:core|device)?|google\.com/tpu"
)
"""The resource names of the accelerators' device plugins (NVIDIA, AMD, Intel, Habana, Huawei, AWS, GKE)."""

_NAMES = (
    b".com/gpu", b"nvidia.com/mig-", b"gpu.intel.com/", b"habana.ai/gaudi", b"huawei.com/Ascend",
    b"aws.amazon.com/neuron", b"google.com/tpu",
)
"""Substrings of which one is in every accelerator count line: a block holding none is not read line by line."""
_WORDS = (b"apacity", b"llocatable")
_NAME_KEY = (b"Name", b"name")
_ALLOCATABLE = _WORDS[1]
"""The one word every block of interest holds (with the block before it): the only search most blocks get."""
TAIL_READ_BYTES = 4096
"""Bytes at a block's end kept for the next block: a capacity section just before an allocatable one."""
MAX_SECTION_LINES = 64
"""Lines after a header within which its counts must stand (a node's Capacity section has about ten)."""
MAX_COUNTS = 64
"""Counts kept waiting for their pair at most (a node has a few accelerator resources); more are forgotten."""

_HEADER = re.compile(r'([ \t]*)"?([Cc]apacity|[Aa]llocatable)"?[ \t]*:[ \t]*\{?[ \t]*')
"""A section header as a whole message: indentation, then the word (group 2), then nothing but a JSON brace."""
_COUNT = re.compile(r'([ \t]*)"?(' + ACCELERATORS + r')"?[ \t]*:[ \t]*"?(\d{1,6})(?!\d)')
"""An accelerator's count at a message's start: indentation, the resource (group 2), the count (group 3)."""
_NODE_NAME = re.compile(r'([ \t]*)"?[Nn]ame"?[ \t]*:[ \t]*"?([A-Za-z0-9][A-Za-z0-9._\-]{0,252})"?,?[ \t]*')
"""A ``Name:`` line (``kubectl describe``) or ``name:`` key (``metadata.name``): a new object, its name (group 2)."""
_CANDIDATE_AFTER_NAME_KEY = re.compile(rb'"?[ \t]*:[ \t]*"?[A-Za-z0-9][A-Za-z0-9._\-]{0,252}"?,?[ \t]*(?:\n|$)')
_CANDIDATE_AFTER_WORD = re.compile(rb'"?[ \t]*:[ \t]*\{?[ \t]*(?:\n|$)')
_CANDIDATE_AFTER_NAME = re.compile(rb'[\w.\-/]{0,30}"?[ \t]*:[ \t]*"?\d')
_NOT_BLANK = re.compile(r"[^ \t]")
_CANDIDATES = ((_WORDS, _CANDIDATE_AFTER_WORD), (_NAMES, _CANDIDATE_AFTER_NAME), (_NAME_KEY, _CANDIDATE_AFTER_NAME_KEY))
"""The substrings that make a line worth parsing, each with what must follow it."""

NOTE = "(kcover: {node}allocatable {resource} {allocatable} < capacity {capacity})"
"""Appended to the line that completes a pair whose allocatable count is below its capacity; ``node`` is
``node NAME: `` when the description named its node, else empty."""


@dataclass
class _Section:
    name: str  # "capacity" or "allocatable"
    indent: int
    lines_left: int = MAX_SECTION_LINES


def _message(raw: bytes) -> str:
    line = parse_line(raw)
    return line.text[line.message_at :]


def _indent(message: str) -> int:
    found = _NOT_BLANK.search(message)
    return len(message[: found.start()].expandtabs()) if found else -1


def _candidate_starts(block: bytes) -> list[int]:
    """Starts of the lines where a header word ends before a line's end, or a name stands before ``: N``."""
    starts = set()
    for words, after in _CANDIDATES:
        for word in words:
            at = block.find(word)
            while at >= 0:
                if after.match(block, at + len(word)):
                    starts.add(block.rfind(b"\n", 0, at) + 1)
                at = block.find(word, at + len(word))
    return sorted(starts)


def _tail_of(block: bytes) -> bytes:
    """The whole lines of the last :data:`TAIL_READ_BYTES` of a block."""
    return block[block.rfind(b"\n", 0, max(len(block) - TAIL_READ_BYTES, 0)) + 1 :]


@dataclass
class _NodeResources:
    tail: bytes = b""
    """The end of the block before, if it was passed over unread: read when the next holds an allocatable section."""
    section: _Section | None = None
    counts: dict[tuple[str, str], int] = field(default_factory=dict)
    """(section, resource) → the count last seen, until its pair is compared or a new node begins."""
    node: str = ""
    """The name of the node being described (its ``Name:`` or ``metadata.name``), or ``""``."""
    header_indent: int | None = None
    """The indentation of the last section header: a name line no deeper begins a new node."""

    def read(self, block: bytes) -> bytes:
        if _ALLOCATABLE not in block:
            if self.section is None and not self.counts:
                self.tail = _tail_of(block)
                return block
            block = self._read_named(block)  # what the block before left open may be completed here
            self.section, self.counts, self.tail = None, {}, b""
            return block
        if self.tail:
            self._read(self.tail)  # the block before was passed over: a capacity section may end it
        block = self._read_named(block)
        self.tail = b""
        return block

    def _read_named(self, block: bytes) -> bytes:
        if any(name in block for name in _NAMES):
            return self._read(block)
        self.section = None
        self._read(_tail_of(block))  # names no accelerator: nothing to note, only a header to keep
        return block

    def _read(self, block: bytes) -> bytes:
        pieces: list[bytes] = []
        done = 0
        after = 0  # where the lines not yet passed over by the open section start
        for start in _candidate_starts(block):
            self._pass_over(block, after, start)
            stop = block.find(b"\n", start)
            stop = len(block) if stop < 0 else stop
            after = min(stop + 1, len(block))
            note = self._line(_message(block[start:stop]))
            if note:
                pieces += [block[done:stop], b"  ", note]
                done = stop
        self._pass_over(block, after, len(block))
        return block if not pieces else b"".join(pieces) + block[done:]

    def _pass_over(self, block: bytes, start: int, stop: int) -> None:
        """The lines from ``start`` to ``stop`` are no candidates: they may close the open section."""
        section = self.section
        if section is None or start >= stop:
            return
        count = block.count(b"\n", start, stop) + (not block.endswith(b"\n", start, stop))
        if count >= section.lines_left:  # counted before splitting: a long span is never copied line by line
            self.section = None
            return
        lines = block[start:stop].split(b"\n")
        if block.endswith(b"\n", start, stop):
            lines.pop()
        section.lines_left -= len(lines)
        if any(0 <= _indent(_message(raw)) <= section.indent for raw in lines):
            self.section = None

    def _line(self, message: str) -> bytes | None:
        """Read one candidate line's message; the note to append to it, if it completes a short pair."""
        header = _HEADER.fullmatch(message)
        if header:
            name = header.group(2).lower()
            indent = _indent(message)
            if any(kind == name for kind, _ in self.counts) or indent != self.header_indent:
                self.counts.clear()  # a second section of one kind, or not the other's sibling: no pair
            if self.header_indent is not None and indent != self.header_indent:
                self.node = ""  # another document's sections: the name read before is not its node
            self.section = _Section(name, indent)
            self.header_indent = self.section.indent
            return None
        named = _NODE_NAME.fullmatch(message)
        if named and (self.header_indent is None or _indent(message) <= self.header_indent):
            self.node, self.section = named.group(2), None
            self.counts.clear()
            return None
        section = self.section
        if section is None:
            return None
        section.lines_left -= 1
        if section.lines_left < 0 or 0 <= _indent(message) <= section.indent:
            self.section = None
            return None
        count = _COUNT.match(message)
        return self._count(section.name, count.group(2), int(count.group(3))) if count else None

    def _count(self, section: str, resource: str, count: int) -> bytes | None:
        other = "allocatable" if section == "capacity" else "capacity"
        paired = self.counts.pop((other, resource), None)
        if paired is None:
            if len(self.counts) >= MAX_COUNTS:
                self.counts.clear()
            self.counts[(section, resource)] = count
            return None
        allocatable, capacity = (count, paired) if section == "allocatable" else (paired, count)
        if allocatable >= capacity:
            return None
        node = f"node {self.node}: " if self.node else ""
        return NOTE.format(node=node, resource=resource, allocatable=allocatable, capacity=capacity).encode()


def read_node_resources(blocks: Iterable[bytes]) -> Iterator[bytes]:
    """The blocks of one log, a note appended where a node's allocatable accelerators fall below its capacity."""
    reader = _NodeResources()
    for block in blocks:
        yield reader.read(block)
