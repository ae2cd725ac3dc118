"""The checksums are zlib's CRC-32 whichever library computes them: checkpoints written before stay loadable."""

from __future__ import annotations

import os
import zlib

from kcover.checkpoint import checksums


def test_block_and_running_checksums_equal_zlibs() -> None:
    blocks = [os.urandom(size) for size in (0, 1, 4095, 1 << 20, 3 << 20)]
    per_block = checksums.Checksums()
    running = checksums.Checksums(running=True)
    for block in blocks:
        per_block.add(memoryview(block))
        running.add(memoryview(block))
    assert per_block.finish() == [zlib.crc32(block) for block in blocks]
    assert running.finish() == [zlib.crc32(b"".join(blocks))]


def test_the_fast_crc_is_used_where_it_is_installed() -> None:
    try:
        import isal.isal_zlib
    except ImportError:
        assert checksums.crc32 is zlib.crc32
    else:
        assert checksums.crc32 is isal.isal_zlib.crc32
