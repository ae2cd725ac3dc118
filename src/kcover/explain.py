"""``explain``: from log text or log files to a verdict, the library's front door.

``kcover.explain(text)`` classifies a string or lines; :func:`explain_paths`
reads files and folders of per-rank logs (:func:`read_paths` also says how
many logs it read: a verdict from nothing read means nothing), compressed
files and archives of logs included (:mod:`kcover.collect.packed`);
:func:`scan_stream` is the streaming core both use (and the launcher uses for
live worker output).  Memory stays
bounded on any input: blocks of about 1 MiB are scanned and only the lines the
engine flags are ever decoded.
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import IO

from kcover.classify.attribution import attribute
from kcover.classify.collector import FaultCollector
from kcover.classify.matcher import Matcher, default_matcher
from kcover.collect.lines import ByteStream, dedent_blocks, read_blocks
from kcover.collect.node_resources import read_node_resources
from kcover.collect.packed import open_logs
from kcover.collect.partial_lines import join_partial_blocks
from kcover.collect.printable import printable
from kcover.collect.sources import SourceInfo, find_sources
from kcover.collect.task_labels import read_task_labels
from kcover.faults import Verdict


def scan_stream(
    matcher: Matcher, stream: ByteStream, source: SourceInfo, collector: FaultCollector, *, lines_before: int = 0
) -> int:
    """Scan a byte stream to its end into ``collector``; returns the number of lines read.

    ``lines_before``: lines of the same source already scanned (its rotated
    files), so line numbers and the kept tail run on across them.
    """
    lines = lines_before
    for block in dedent_blocks(read_node_resources(read_task_labels(join_partial_blocks(read_blocks(stream))))):
        hits, breaks = matcher.scan_counted(block, lines + 1)
        for hit in hits:
            collector.add_hit(source, hit)
        lines += breaks
        collector.keep_tail(source, block, lines)
    collector.settle_tail(source)
    return lines


def _as_bytes(text_or_lines: str | bytes | Iterable[str]) -> bytes:
    if isinstance(text_or_lines, bytes):
        return text_or_lines
    if isinstance(text_or_lines, str):
        return text_or_lines.encode("utf-8", errors="surrogateescape")
    return "\n".join(line.rstrip("\n") for line in text_or_lines).encode("utf-8", errors="surrogateescape")


def explain(
    text_or_lines: str | bytes | Iterable[str],
    *,
    source: str = "<input>",
    catalogs: Sequence[str] = (),
    matcher: Matcher | None = None,
) -> Verdict:
    """The verdict for one log text (a string, bytes, or an iterable of lines).

    Bytes that are a compressed log or an archive of logs are unpacked as
    :func:`explain_paths` unpacks files (:mod:`kcover.collect.packed`); what
    could not be read is named in the verdict's warnings.
    """
    matcher = matcher or default_matcher(tuple(catalogs))
    collector = FaultCollector()
    info = SourceInfo(name=source)
    if isinstance(text_or_lines, bytes):
        warnings: list[str] = []
        scan_logs(matcher, io.BytesIO(text_or_lines), info, collector, warnings, seekable=True)
        return attribute(collector.faults, warnings, collector.tails, collector.progress)
    scan_stream(matcher, io.BytesIO(_as_bytes(text_or_lines)), info, collector)
    return attribute(collector.faults, tails=collector.tails, progress=collector.progress)


def explain_paths(paths: Sequence[Path], *, matcher: Matcher | None = None) -> Verdict:
    """The verdict for a job whose logs are these files and folders (one source per file)."""
    return read_paths(paths, matcher=matcher)[0]


def read_paths(paths: Sequence[Path], *, matcher: Matcher | None = None) -> tuple[Verdict, int]:
    """:func:`explain_paths`, also returning how many files were read (0: the verdict means nothing)."""
    matcher = matcher or default_matcher()
    sources, warnings = find_sources(list(paths))
    collector = FaultCollector()
    read = 0
    for source in sources:
        lines = 0
        for path in source.paths:  # a kubelet log's rotated files first: one stream, as `kubectl logs` shows it
            try:
                with path.open("rb") as stream:
                    logs, lines = scan_logs(
                        matcher, stream, source.info, collector, warnings, seekable=stream.seekable(),
                        lines_before=lines,
                    )
                read += logs
            except OSError as exc:
                warnings.append(f"{printable(str(path))}: cannot read ({exc.strerror or exc}), skipped")
    return attribute(collector.faults, warnings, collector.tails, collector.progress), read


def scan_logs(
    matcher: Matcher, stream: IO[bytes], info: SourceInfo, collector: FaultCollector, warnings: list[str],
    *, seekable: bool, lines_before: int = 0,
) -> tuple[int, int]:
    """Scan one file or pipe, unpacked when it is compressed or an archive.

    Returns how many logs were read and the line count of ``info``'s stream
    (``lines_before`` plus this file's lines; archive members are sources of
    their own).  Data cut short or damaged is read up to the damage and named
    in a warning with the line where reading stopped (:mod:`kcover.collect.packed`).
    """
    read, lines = 0, lines_before
    for log in open_logs(stream, info, warnings, seekable=seekable):
        own = log.info == info
        ended = scan_stream(matcher, log.stream, log.info, collector, lines_before=lines if own else 0)
        lines = ended if own else lines
        read += 1
        if log.damage is not None:
            warnings.append(
                f"{log.info.name}: {log.packing} data cut short or damaged after line {ended} ({log.damage});"
                " read up to there"
            )
    return read, lines
