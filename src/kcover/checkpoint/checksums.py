"""CRC-32 on a helper thread, so checksumming overlaps the copy it guards (both release the GIL).

:class:`Checksums` takes blocks in order and gives one CRC-32 per block (the disk
manifest's) or, ``running=True``, one CRC-32 of all of them together (a replica's).
A block must stay unchanged until :meth:`Checksums.finish`.  Not a
ThreadPoolExecutor: those refuse work once the interpreter is shutting down,
which is exactly when a persist still in flight must finish; if no thread can
be started the checksums are computed inline.  The CRC-32 is Intel ISA-L's
(``isal``, installed with the ``torch`` extra where it has wheels: the same
values as zlib's, about 4x faster) when it is there, zlib's otherwise.  Used by
:mod:`~kcover.checkpoint.disk` and :mod:`~kcover.checkpoint.replica_link`.
"""

from __future__ import annotations

import queue
import threading

try:
    from isal.isal_zlib import crc32
except ImportError:  # no wheel for this platform
    from zlib import crc32

__all__ = ["Checksums", "crc32"]


class Checksums:
    """Per-block CRC-32s (or one running CRC-32) of the blocks given to :meth:`add`, in order."""

    def __init__(self, running: bool = False) -> None:
        self.values: list[int] = []
        self._running = running
        self._crc = 0
        self._blocks: queue.SimpleQueue[memoryview | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = threading.Thread(target=self._run, name="kcover-crc", daemon=True)
        try:
            self._thread.start()
        except RuntimeError:
            self._thread = None

    def _take(self, block: memoryview) -> None:
        if self._running:
            self._crc = crc32(block, self._crc)
        else:
            self.values.append(crc32(block))

    def _run(self) -> None:
        while (block := self._blocks.get()) is not None:
            self._take(block)

    def add(self, block: memoryview) -> None:
        if self._thread is None:
            self._take(block)
        else:
            self._blocks.put(block)

    def finish(self) -> list[int]:
        """Wait for every block; the per-block CRCs, or ``[running CRC]``."""
        if self._thread is not None:
            self._blocks.put(None)
            self._thread.join()
            self._thread = None
        return [self._crc] if self._running else self.values
