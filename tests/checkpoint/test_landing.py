"""The memory a restore reads into: zeroed, writable, the right size, in huge pages where the kernel has them,
and a clear error where there is no memory to be had."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kcover.checkpoint.errors import CheckpointError
from kcover.checkpoint.landing import landing_buffer

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


@pytest.mark.parametrize("size", [0, 1, 4097, 3 << 20, 64 << 20])
def test_the_buffer_is_zeroed_writable_and_exactly_the_size(size: int) -> None:
    data = landing_buffer(size, "rank 0's shard")
    assert data.dtype == torch.uint8 and data.numel() == size
    assert not data.any()
    data.fill_(7)
    assert int(data.sum()) == 7 * size


def huge_kib(address: int) -> int:
    """AnonHugePages of the mapping that holds ``address``, from /proc/self/smaps."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and ":" not in head:
            low, high = (int(x, 16) for x in head.split("-"))
            inside = low <= address < high
        elif inside and head == "AnonHugePages:":
            return int(line.split()[1])
    return 0


@pytest.mark.skipif(not THP.exists() or "[never]" in THP.read_text(), reason="no transparent huge pages here")
def test_a_large_buffer_is_in_huge_pages_unless_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    data = landing_buffer(64 << 20, "rank 0's shard")
    assert huge_kib(data.data_ptr()) >= 32 << 10  # at least half of it (the ends may not be 2 MiB aligned)
    if "[always]" not in THP.read_text():  # "madvise": only what asks for them gets them
        monkeypatch.setenv("KCOVER_HUGE_PAGES", "0")
        small = landing_buffer(64 << 20, "rank 0's shard")
        assert huge_kib(small.data_ptr()) == 0 and not small.any()


@pytest.mark.parametrize("size", [1 << 60, -1])
def test_no_memory_to_be_had_is_a_checkpoint_error_naming_what(size: int) -> None:
    with pytest.raises(CheckpointError, match="rank 3's shard: cannot allocate"):
        landing_buffer(size, "rank 3's shard")
