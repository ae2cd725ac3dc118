"""The replicas a rank keeps for its buddies: files in its node's shared memory, never torn.

A replica is a peer's snapshot image, byte for byte, in the keeper's snapshot
folder (``/dev/shm`` or ``KCOVER_SHARED_MEMORY``), so it outlives the keeper's
process as the keeper's own snapshot does.  Names extend the snapshot's:
``kcover-<job>-rank00003.replica-s<step>-c<crc32>.img`` holds rank 3's image of
``step`` whose CRC-32 is ``crc32`` (every reader checks it: a replica that was
bit-flipped in memory is not restored).  A replica arrives under a temporary
``….replica-p<pid>.img.next`` name and is renamed into place only once every
byte is in and the checksum matches: a keeper killed mid-transfer leaves the
previous replica intact and a ``.next`` file that any keeper of the same job
removes once nobody has written to it for a minute (a live transfer stamps it
after every chunk); the node agent's sweep and
:func:`~kcover.checkpoint.remove_snapshots` remove such files too.

The two newest steps per peer are kept: ranks finish their replication at
different moments, and the step every rank can load from memory is, when a
node dies mid-replication, often the one before the newest.  A transfer reuses
the file (and the pages) of the oldest replica the commit would drop anyway, so
the newest stays through any failure and the memory cost per keeper is 2 × the
peer's snapshot per peer kept (plus one in transfer while fewer are held).

A node's folder also holds the own snapshots of ranks that ran here before and
now run elsewhere (their pod was rescheduled to another node).  The ranks in
:attr:`ReplicaStore.serves` (those of the job not on this node now) have such a
snapshot offered as if it were a replica, its checksum computed when it is
served, so a surviving node's memory is served by whichever rank of the job
runs there, not only by the one that wrote it.
Called by :mod:`~kcover.checkpoint.replication`.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import mmap
import os
import re
import secrets
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path

from kcover.checkpoint import checksums
from kcover.checkpoint.checksums import Checksums
from kcover.checkpoint.errors import CheckpointWriteError
from kcover.checkpoint.files import open_regular, regular_size
from kcover.checkpoint.image import COMMITTED, HEADER_SIZE, Header, read_header

log = logging.getLogger("kcover.checkpoint")
KEEP = 2
STALE_PARTIAL_SECONDS = 60.0
RECEIVE_CHUNK = 16 << 20
_NAME = re.compile(r"rank(\d{5})\.replica-s(-?\d+)-c([0-9a-f]{8})\.img$")
_PARTIAL = re.compile(r"rank\d{5}\.replica-p([0-9a-f]+)-\d+\.img\.next$")


@dataclass(frozen=True)
class Held:
    """One replica on this node: whose, which step, its checksum (None: a snapshot left behind, whose
    checksum is computed when it is served) and where."""

    rank: int
    step: int
    crc32: int | None
    path: Path


class ReplicaStore:
    """Replicas of one job's snapshots kept in ``folder`` (names start with ``prefix``)."""

    def __init__(self, folder: Path, prefix: str) -> None:
        self.folder, self.prefix = folder, prefix
        self._lock = threading.Lock()  # commits of one rank's replicas, one at a time
        self._serial = itertools.count()
        self._nonce = secrets.token_hex(4)  # this store's partials (a pid is reused by the next container)
        self.serves: frozenset[int] = frozenset()  # ranks whose snapshots left here are offered as replicas
        self._remove_dead_partials()

    def _path(self, rank: int, step: int, crc: int) -> Path:
        return self.folder / f"{self.prefix}{rank:05d}.replica-s{step}-c{crc:08x}.img"

    def _remove_dead_partials(self) -> None:
        """Remove other stores' partials that nobody wrote to for ``STALE_PARTIAL_SECONDS`` (a live
        transfer stamps its file after every chunk): their writer was killed."""
        with contextlib.suppress(OSError):
            for path in self.folder.glob(f"{self.prefix}*.replica-p*.img.next"):
                found = _PARTIAL.search(path.name)
                with contextlib.suppress(OSError):
                    old = time.time() - path.lstat().st_mtime > STALE_PARTIAL_SECONDS
                    if found and found.group(1) != self._nonce and old:
                        path.unlink()

    def held(self) -> list[Held]:
        """Every complete replica of this job on this node."""
        found = []
        with contextlib.suppress(OSError):
            for path in self.folder.glob(f"{self.prefix}*.replica-s*.img"):
                match = _NAME.search(path.name)
                if match and regular_size(path) is not None:  # not a symlink, FIFO or folder
                    found.append(Held(int(match.group(1)), int(match.group(2)), int(match.group(3), 16), path))
        return sorted(found, key=lambda h: (h.rank, h.step))

    def left_behind(self, ranks: Collection[int] | None = None) -> list[Held]:
        """The committed own snapshots that ranks in :attr:`serves` (and in ``ranks``, when given) left here."""
        found = []
        for rank in sorted(self.serves if ranks is None else self.serves.intersection(ranks)):
            path = self.folder / f"{self.prefix}{rank:05d}.img"
            try:
                fd = open_regular(path)
            except OSError:  # none, or not a regular file
                continue
            try:
                header = _committed_header(fd)
            finally:
                os.close(fd)
            if header is not None and header.rank == rank:
                found.append(Held(rank, header.step, None, path))
        return found

    def offered(self) -> list[Held]:
        """What this node can serve: its replicas, then the snapshots left behind."""
        return self.held() + self.left_behind()

    def find(self, rank: int, step: int) -> Held | None:
        return next((h for h in self.held() + self.left_behind([rank]) if h.rank == rank and h.step == step), None)

    @staticmethod
    def extent(held: Held, fd: int) -> tuple[int, int] | None:
        """The bytes to serve of ``held`` (open as ``fd``) and their CRC-32; None if it is no longer whole.

        A replica is served whole with the checksum in its name.  A snapshot left behind is served up to the
        end its header gives, checksummed now; should its header change meanwhile (a writer came back), it
        is not served (and a fetcher checks the bytes it gets against this checksum in any case).
        """
        if held.crc32 is not None:
            return os.fstat(fd).st_size, held.crc32
        header = _committed_header(fd)
        if header is None or header.step != held.step or not 0 < header.total <= os.fstat(fd).st_size:
            return None
        with mmap.mmap(fd, header.total, prot=mmap.PROT_READ) as mapping:
            crc = checksums.crc32(mapping)
        return (header.total, crc) if _committed_header(fd) == header else None

    def receive(self, rank: int, step: int, size: int, read_into: Callable[[memoryview], int],
                ready: Callable[[], None]) -> tuple[Path, int]:
        """Write ``size`` bytes from ``read_into`` as ``rank``'s replica of ``step``, uncommitted.

        ``ready()`` is called once the room is reserved, before the first byte is read;
        ``read_into(view)`` fills up to ``len(view)`` bytes and returns how many (0: the sender is gone); the
        bytes go straight into the mapped file.  Returns the temporary file and the bytes' CRC-32, for
        :meth:`commit` or :meth:`discard`.  Raises :class:`CheckpointWriteError` (no room, sender gone) or
        OSError; nothing is left behind then.
        """
        partial = self.folder / f"{self.prefix}{rank:05d}.replica-p{self._nonce}-{next(self._serial)}.img.next"
        recycled = self._recycle(rank, step, partial)
        fd = open_regular(partial, os.O_RDWR | os.O_CREAT | (0 if recycled else os.O_TRUNC), 0o600)
        checksum = Checksums(running=True)
        try:
            try:
                os.posix_fallocate(fd, 0, max(size, 1))  # ENOSPC now, not SIGBUS while writing the mapping
            except (OverflowError, ValueError):
                raise CheckpointWriteError(f"rank {rank}'s replica of step {step}: {size} bytes is no size") from None
            except OSError as exc:
                if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                    raise CheckpointWriteError(f"no room for rank {rank}'s replica of step {step} ({size} bytes) "
                                               f"in {self.folder}: {exc.strerror}") from None
                os.ftruncate(fd, size)
            if recycled:
                os.ftruncate(fd, size)  # a recycled file may be longer than this replica
            ready()
            self._fill(fd, size, read_into, checksum, f"rank {rank}'s replica of step {step}")
        except BaseException:
            checksum.finish()
            os.close(fd)
            with contextlib.suppress(OSError):
                partial.unlink()
            raise
        os.close(fd)
        return partial, checksum.finish()[0]

    def _recycle(self, rank: int, step: int, partial: Path) -> bool:
        """Move the oldest of ``rank``'s replicas to ``partial`` when the commit of ``step`` would drop it anyway.

        Its pages are reused: a replica written over one costs no page allocation (on a busy node, a fault per
        page is a third of what keeping a replica costs).  Only when ``KEEP`` older replicas are held, so the
        newest one stays whatever happens to this transfer.
        """
        with self._lock:
            older = [h for h in self.held() if h.rank == rank and h.step < step]
            if len({h.step for h in older}) < KEEP:
                return False
            try:
                os.utime(older[0].path)  # stamped first: a partial with an old stamp is a killed writer's
                os.replace(older[0].path, partial)
            except OSError:
                return False
            return regular_size(partial) is not None

    @staticmethod
    def _fill(fd: int, size: int, read_into: Callable[[memoryview], int], checksum: Checksums, what: str) -> None:
        if size == 0:
            return
        mapping = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0))  # no fault per page
        try:
            done = 0
            while done < size:
                view = memoryview(mapping)[done : done + RECEIVE_CHUNK]
                got = read_into(view)
                if got <= 0:
                    raise CheckpointWriteError(f"{what}: the sender went away after {done} of {size} bytes")
                checksum.add(view[:got])
                done += got
                os.utime(fd)  # alive: no other keeper takes this file for a killed writer's
        finally:
            checksum.finish()  # the checksum thread lets go of the views before the mapping closes
            with contextlib.suppress(BufferError):
                mapping.close()

    def commit(self, partial: Path, rank: int, step: int, crc: int) -> None:
        """Put a received replica in place, then keep only the ``KEEP`` newest steps of ``rank``.

        A replica of a step at or below the newest kept means the job went back (restored an older step,
        or started over): the later ones belong to a timeline it abandoned and are removed.
        """
        with self._lock:
            os.replace(partial, self._path(rank, step, crc))
            mine = [h for h in self.held() if h.rank == rank]
            for held in mine:
                if held.step > step or (held.step == step and held.crc32 != crc):
                    self._remove(held.path)
            mine = [h for h in mine if h.step <= step]
            steps = sorted({h.step for h in mine}, reverse=True)[:KEEP]
            for held in mine:
                if held.step not in steps:
                    self._remove(held.path)
        self._remove_dead_partials()

    @staticmethod
    def discard(partial: Path) -> None:
        """Drop a received replica (its checksum did not match the sender's)."""
        with contextlib.suppress(OSError):
            partial.unlink()

    def drop_newer_than(self, step: int | None) -> None:
        """After a restore from ``step`` (None: from nothing): replicas of later steps belong to a timeline
        the job abandoned."""
        with self._lock:
            for held in self.held():
                if step is None or held.step > step:
                    self._remove(held.path)

    def _remove(self, path: Path) -> None:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _committed_header(fd: int) -> Header | None:
    header = read_header(os.pread(fd, HEADER_SIZE, 0))
    return header if header is not None and header.state == COMMITTED else None
