"""Logs that arrive packed: gzip, bzip2 and xz files, and tar and zip archives of logs.

Operators keep logs compressed.  The kubelet gzips a container's rotated logs
(``0.log.20261201-101500.gz``), logrotate compresses old files, NVIDIA's
``nvidia-bug-report.sh`` writes ``nvidia-bug-report.log.gz``, and support
bundles come as ``.tar.gz`` or ``.zip``.  Read as bytes, such a file holds no
line a rule can match, so a verdict over it would say "no fault" about a log
never read.

:func:`open_logs` decides by a file's first bytes, never by its name, and
yields one :class:`Opened` log per thing to scan: the file itself, its
decompressed text, or each regular file inside an archive (named
``archive:path/inside``; rank, node and pod are read from the path inside as
if the archive were the folder given; a first folder named like the archive,
``bundle/`` in ``bundle.tar.gz``, is the folder that was packed, not a node).
A compressed file inside an archive is decompressed too; an archive inside an
archive is named in a warning and skipped.

Decompression is streamed, so memory stays bounded on any input (a gzip bomb
costs time, not memory).  Data that is cut short or damaged is read up to the
damage, and :attr:`Opened.damage` says what went wrong, so the caller can name
it with the line where reading stopped; what was read still counts.  A format
that cannot be read here (zstd, a systemd journal file, a zip archive piped to
stdin) is named in a warning that says what to run instead.
"""

from __future__ import annotations

import _compression
import bz2
import gzip
import io
import itertools
import lzma
import re
import tarfile
import zipfile
import zlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import PurePosixPath
from typing import IO, Self, cast

from kcover.collect.lines import ByteStream
from kcover.collect.printable import printable
from kcover.collect.sources import SourceInfo, describe_relative, is_pod_folder

HEAD_BYTES = 512
"""Bytes read to recognise a format: a tar header's ``ustar`` magic sits at offset 257."""
MAX_ARCHIVE_LOGS = 4096
"""Logs read from one archive; each keeps a tail of its own while the verdict is formed (memory)."""
MAX_ARCHIVE_ENTRIES = 65536
"""Entries of any kind (folders, links) looked at in one archive: a zip's whole index is held in memory."""
MAX_HEADER_BYTES = 1 << 16
"""A tar long-name or pax header larger than this is damage (tarfile would hold it whole)."""
XZ_MEMORY_LIMIT = 96 << 20
"""Memory the xz decoder may take (``xz -9`` needs 65 MiB); a header asking for more is named, not obeyed."""

_DAMAGE = (
    EOFError, OSError, zlib.error, lzma.LZMAError, tarfile.TarError, zipfile.BadZipFile,
    ValueError, NotImplementedError, RuntimeError, IndexError,
)
"""What decompressors and archive readers raise on cut, damaged or hostile data.

gzip's and bz2's errors are OSErrors; ``zipfile`` and ``tarfile`` also raise
ValueError (a bad UTF-8 name, a bad pax number), NotImplementedError (a zip
version or method), RuntimeError (an encrypted member) and IndexError."""

_COMPRESSED = ("gzip", "bzip2", "xz")
_ZIP_METHODS = (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED)
"""Zip members read: zipfile's bzip2 and lzma readers decompress a whole chunk at once (unbounded memory)."""
_UNREADABLE = {
    "zstd": "compressed with zstd, which kcover cannot read: decompress it first (zstd -dc FILE | kcover explain)",
    "journal": "a systemd journal file (binary): export it first"
    " (journalctl --file FILE -o short-iso | kcover explain)",
}


def _decompressing(packing: str, raw: ByteStream) -> io.BufferedIOBase:
    """A reader of ``raw``'s decompressed bytes (``raw`` stays open; the reader holds no descriptor)."""
    compressed = cast(IO[bytes], raw)  # the decompressors only call read()
    if packing == "gzip":
        return gzip.GzipFile(fileobj=compressed, mode="rb")
    if packing == "bzip2":
        return bz2.BZ2File(compressed, mode="rb")
    # LZMAFile has no memory limit: the same stream reader it uses, with one (a 200 KB file may ask for 2 GiB).
    return io.BufferedReader(_compression.DecompressReader(
        compressed, lzma.LZMADecompressor, trailing_error=lzma.LZMAError, memlimit=XZ_MEMORY_LIMIT
    ))


def _is_tar(head: bytes) -> bool:
    """A POSIX tar header: the ``ustar`` magic and a header checksum that adds up (so a log saying "ustar" is text)."""
    if len(head) < 512 or head[257:262] != b"ustar":
        return False
    try:
        recorded = int(head[148:156].replace(b"\x00", b" ").strip() or b"-1", 8)
    except ValueError:
        return False
    return recorded == sum(head[:148]) + 8 * 32 + sum(head[156:512])


def format_of(head: bytes) -> str:
    """The packing a file's first bytes show: gzip, bzip2, xz, zstd, zip, tar, journal, or text."""
    if head.startswith(b"\x1f\x8b"):
        return "gzip"
    if head.startswith(b"BZh") and head[4:10] in (b"\x31\x41\x59\x26\x53\x59", b"\x17\x72\x45\x38\x50\x90"):
        return "bzip2"  # the block (pi) or end-of-stream (sqrt pi) magic right after "BZh1".."BZh9"
    if head.startswith(b"\xfd7zXZ\x00"):
        return "xz"
    if head.startswith(b"\x28\xb5\x2f\xfd"):
        return "zstd"
    if head.startswith((b"PK\x03\x04", b"PK\x05\x06")):
        return "zip"
    if _is_tar(head):
        return "tar"
    if head.startswith(b"LPKSHHRH"):
        return "journal"
    return "text"


class _Rejoined:
    """A stream whose first bytes were read to recognise its format, with those bytes put back in front."""

    def __init__(self, head: bytes, rest: ByteStream) -> None:
        self._head = head
        self._rest = rest

    def read(self, size: int = -1) -> bytes:
        """Bytes as the stream had them: the first read gives the whole size asked, head and rest together.

        (The readers cut blocks by what one read gives: a first block of only
        the head would change where the first block ends, and so what
        ``dedent_blocks`` decides from it.)
        """
        if not self._head:
            return self._rest.read(size)
        if 0 <= size <= len(self._head):
            data, self._head = self._head[:size], self._head[size:]
            return data
        data, self._head = self._head + self._rest.read(size - len(self._head) if size >= 0 else -1), b""
        return data


class _UpToDamage:
    """Reads a decompressing stream until its data ends or turns out cut or damaged.

    Data is gathered in steps of ``read1`` (one step of decompression each), so
    nothing already decompressed is lost when a later step fails; the failure
    is kept in :attr:`damage` and the stream then ends.
    """

    def __init__(self, inner: io.BufferedIOBase) -> None:
        self._inner = inner
        self.damage: str | None = None

    def read(self, size: int = -1) -> bytes:
        gathered = bytearray()
        while self.damage is None and (size < 0 or len(gathered) < size):
            try:
                step = self._inner.read1(size - len(gathered) if size >= 0 else -1)
            except _DAMAGE as error:
                self.damage = str(error) or type(error).__name__
                break
            if not step:
                break
            gathered += step
        return bytes(gathered)


@dataclass
class Opened:
    """One log to scan: where it comes from, its bytes, and the packing they were read through."""

    info: SourceInfo
    stream: ByteStream
    packing: str = "text"
    reader: _UpToDamage | None = field(default=None, repr=False)

    @property
    def damage(self) -> str | None:
        """Why reading stopped before the data's end (cut or damaged), or None."""
        return self.reader.damage if self.reader else None


def read_head(stream: ByteStream) -> bytes:
    """Up to :data:`HEAD_BYTES` first bytes of a stream (a pipe may give them in several reads)."""
    head = b""
    while len(head) < HEAD_BYTES:
        chunk = stream.read(HEAD_BYTES - len(head))
        if not chunk:
            break
        head += chunk
    return head


def open_logs(stream: IO[bytes], info: SourceInfo, warnings: list[str], *, seekable: bool) -> Iterator[Opened]:
    """The logs in one opened file or pipe, each ready to scan (see the module's docstring).

    ``seekable`` says whether ``stream`` is a file that may be read out of order
    (a zip archive needs that; a pipe is not).  Problems that stop a whole file
    or member from being read are appended to ``warnings``.
    """
    head = read_head(stream)
    packing = format_of(head)
    if packing == "text":
        yield Opened(info, _Rejoined(head, stream))
        return
    if packing in _UNREADABLE:
        warnings.append(f"{info.name}: {_UNREADABLE[packing]}, skipped")
        return
    if packing == "zip" and not seekable:
        warnings.append(f"{info.name}: a zip archive cannot be read from a pipe: give its path, skipped")
        return
    if packing == "zip":
        yield from _zip_members(stream, info, warnings)
    elif packing == "tar":
        yield from _tar_members(_Rejoined(head, stream), info, warnings)
    else:
        yield from _decompressed(_Rejoined(head, stream), packing, info, warnings)


def _decompressed(raw: _Rejoined, packing: str, info: SourceInfo, warnings: list[str]) -> Iterator[Opened]:
    """A compressed file's text, or the members of the tar archive it holds (``.tar.gz``)."""
    reader = _UpToDamage(_decompressing(packing, raw))
    inner_head = read_head(reader)
    inner = format_of(inner_head)
    if inner == "tar":
        yield from _tar_members(
            _Rejoined(inner_head, reader), info, warnings, packing=f"{packing}-compressed tar", decompressing=reader
        )
    elif inner == "text":
        yield Opened(info, _Rejoined(inner_head, reader), packing, reader)
    else:
        warnings.append(f"{info.name}: {inner} inside {packing}: unpack it first, skipped")


_PACKING_SUFFIX = re.compile(r"(?:\.tar)?(?:\.(?:gz|bz2|xz))?$|\.(?:tgz|tbz2?|txz|zip)$", re.IGNORECASE)


def wrapper_folder(archive_name: str) -> str:
    """The folder an archive of a folder wraps its paths in: ``bundle`` for ``logs/bundle.tar.gz``."""
    return _PACKING_SUFFIX.sub("", PurePosixPath(archive_name).name, count=1)


def _member(archive: SourceInfo, path: str) -> SourceInfo:
    """A member's source: named ``archive:path``, described by its path below the folder that was packed.

    The first folder is taken for the packed folder (not a node) when it is
    named like the archive, or when the log sits two folders or more below
    it (``tar czf logs.tgz job-1/`` holds ``job-1/node-2/rank5.log``), unless
    it is a pod's log folder (``<namespace>_<pod>_<uid>/<container>/0.log``).
    """
    parts = [part for part in PurePosixPath(path).parts if part.strip("/") and part not in (".", "..")]
    deep = len(parts) > 2 and not is_pod_folder(parts[0])
    if len(parts) > 1 and (deep or parts[0] == wrapper_folder(archive.name)):
        parts = parts[1:]
    relative = PurePosixPath(*parts) if parts else PurePosixPath("unnamed")
    described = describe_relative(relative, str(relative))
    return replace(
        described,
        name=f"{archive.name}:{described.name}",
        rank=described.rank if described.rank is not None else archive.rank,
        node=described.node if described.node is not None else archive.node,
    )


def _member_logs(
    archive: SourceInfo, name: str, opened: io.BufferedIOBase, warnings: list[str], seen: Counter[str]
) -> Iterator[Opened]:
    """One archive member's logs: its text, or its decompressed text; never an archive inside it."""
    info = _member(archive, name)
    seen[info.name] += 1
    if seen[info.name] > 1:  # the same path twice (a tar appended to): both are read, apart
        info = replace(info, name=f"{info.name} (copy {seen[info.name]})")
    reader = _UpToDamage(opened)
    head = read_head(reader)
    packing = format_of(head)
    if packing == "text":
        yield Opened(info, _Rejoined(head, reader), "archive member", reader)
        return
    if packing in _COMPRESSED:
        inner = _UpToDamage(_decompressing(packing, _Rejoined(head, reader)))
        inner_head = read_head(inner)
        if format_of(inner_head) == "text":
            yield Opened(info, _Rejoined(inner_head, inner), f"{packing} archive member", inner)
            return
    if packing in _UNREADABLE:
        warnings.append(f"{info.name}: {_UNREADABLE[packing]}, skipped")
    else:
        warnings.append(f"{info.name}: an archive inside an archive: unpack it first, skipped")


_LONG_HEADERS = (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK, tarfile.XHDTYPE, tarfile.XGLTYPE,
                 tarfile.SOLARIS_XHDTYPE)


def _watched_tarinfo(stops: list[tarfile.HeaderError]) -> type[tarfile.TarInfo]:
    """A TarInfo that notes why reading headers stopped and refuses headers too large to hold.

    tarfile ends an archive quietly on a cut or invalid header after the first
    one; the note tells that from the archive's own end (a block of zeros).
    """

    class Watched(tarfile.TarInfo):
        @classmethod
        def frombuf(cls, buf: bytes | bytearray, encoding: str, errors: str) -> Self:
            try:
                return super().frombuf(buf, encoding, errors)
            except tarfile.HeaderError as error:
                stops.append(error)
                raise

        def _proc_member(self, tar: tarfile.TarFile) -> tarfile.TarInfo:
            if self.type in _LONG_HEADERS and self.size > MAX_HEADER_BYTES:
                raise tarfile.HeaderError(f"a {self.size}-byte name or pax header")
            return cast(tarfile.TarInfo, super()._proc_member(tar))  # type: ignore[misc]

    return Watched


def _tar_members(
    raw: _Rejoined, archive: SourceInfo, warnings: list[str], *, packing: str = "tar",
    decompressing: _UpToDamage | None = None,
) -> Iterator[Opened]:
    """Each regular file of a tar archive, read in one pass (the archive may be a pipe or decompressing)."""
    seen: Counter[str] = Counter()
    stops: list[tarfile.HeaderError] = []
    logs = entries = 0
    problem: str | None = None
    try:
        with tarfile.open(fileobj=raw, mode="r|", tarinfo=_watched_tarinfo(stops)) as tar:  # type: ignore[call-overload]
            while (member := tar.next()) is not None:
                tar.members.clear()  # a stream is read once: keeping every entry would grow without bound
                entries += 1
                if entries > MAX_ARCHIVE_ENTRIES or (member.isfile() and logs == MAX_ARCHIVE_LOGS):
                    warnings.append(_too_many(archive))
                    return
                if not member.isfile():
                    continue
                logs += 1
                extracted = tar.extractfile(member)
                if extracted is not None:  # an io.BufferedReader: has read1
                    yield from _member_logs(archive, member.name, cast(io.BufferedIOBase, extracted), warnings, seen)
        if stops and type(stops[-1]).__name__ != "EOFHeaderError":  # the zero block that ends an archive
            problem = str(stops[-1]) or "no end-of-archive marker"  # a cut or invalid header, tarfile's quiet end
    except _DAMAGE as error:
        problem = str(error) or type(error).__name__
    if decompressing is not None and decompressing.damage is not None:
        problem = decompressing.damage  # a .tar.gz's gzip error, not tarfile's "unexpected end of data"
    if problem is not None:
        warnings.append(f"{archive.name}: {packing} archive cut or damaged after {logs} logs ({problem});"
                        " read up to there")


def _too_many(archive: SourceInfo) -> str:
    return (f"{archive.name}: more than {MAX_ARCHIVE_LOGS} logs or {MAX_ARCHIVE_ENTRIES} entries in one archive,"
            " the rest skipped")


def _zip_entry_count(stream: IO[bytes]) -> int | None:
    """The entry count a zip's end record states (zip64's too), read before zipfile loads the whole index."""
    size = stream.seek(0, io.SEEK_END)
    stream.seek(max(0, size - (1 << 16) - 22))
    tail = stream.read()
    end = tail.rfind(b"PK\x05\x06")
    if end < 0 or len(tail) < end + 12:
        return None
    count = int.from_bytes(tail[end + 10:end + 12], "little")
    if count == 0xFFFF:
        record = tail.rfind(b"PK\x06\x06", 0, end)
        count = int.from_bytes(tail[record + 32:record + 40], "little") if record >= 0 else MAX_ARCHIVE_ENTRIES + 1
    return count


def _overlapping(entries: list[zipfile.ZipInfo]) -> bool:
    """Whether two entries' data share bytes: a zip bomb's trick (refused by Python only from 3.11.8 on)."""
    spans = sorted((entry.header_offset, entry.header_offset + entry.compress_size) for entry in entries)
    return any(end > next_start for (_, end), (next_start, _) in itertools.pairwise(spans))


def _zip_members(stream: IO[bytes], archive: SourceInfo, warnings: list[str]) -> Iterator[Opened]:
    """Each regular file of a zip archive, in the archive's order."""
    seen: Counter[str] = Counter()
    try:
        count = _zip_entry_count(stream)
        if count is not None and count > MAX_ARCHIVE_ENTRIES:
            warnings.append(_too_many(archive))
            return
        stream.seek(0)
        with zipfile.ZipFile(stream) as packed:
            members = [entry for entry in packed.infolist() if entry.filename and not entry.filename.endswith("/")]
            if _overlapping(packed.infolist()):
                warnings.append(f"{archive.name}: zip entries overlap (a zip bomb?), skipped")
                return
            for number, entry in enumerate(members):
                if number == MAX_ARCHIVE_LOGS:
                    warnings.append(_too_many(archive))
                    return
                where = f"{archive.name}:{printable(entry.filename)}"
                if entry.compress_type not in _ZIP_METHODS:
                    warnings.append(f"{where}: compressed with zip method {entry.compress_type}, which kcover"
                                    " does not read: unpack it first, skipped")
                    continue
                try:
                    opened = packed.open(entry)
                except _DAMAGE as error:  # encrypted, a bad name, a damaged local header
                    warnings.append(f"{where}: cannot be read ({error}), skipped")
                    continue
                with opened:  # a zipfile.ZipExtFile: has read1
                    yield from _member_logs(archive, entry.filename, cast(io.BufferedIOBase, opened), warnings, seen)
    except _DAMAGE as error:
        warnings.append(f"{archive.name}: zip archive cannot be read ({error}), skipped")
