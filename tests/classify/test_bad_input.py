"""Logs as they really arrive: broken encodings, control characters, giant lines, CRI framing.

None of these may raise; each must still find the fault it hides, at the right line.
"""

from __future__ import annotations

import io

from kcover import Category, explain
from kcover.collect.lines import MAX_LINE_BYTES, parse_line, read_blocks

XID = b"NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python, GPU has fallen off the bus."


def test_crlf_and_carriage_return_progress_bars() -> None:
    text = b"start\r\n 10%|#   | 1/10\r 20%|##  | 2/10\r" + XID + b"\r\nend\r\n"
    verdict = explain(text)
    assert verdict.category is Category.GPU_HARDWARE
    assert verdict.faults[0].evidence.line == XID.decode()


def test_ansi_colour_codes_inside_the_message() -> None:
    text = b"\x1b[31mRuntimeError: CUDA error: \x1b[1man illegal memory access\x1b[0m was encountered\n"
    verdict = explain(text)
    assert verdict.category is Category.CUDA_SOFTWARE
    assert "\x1b" not in verdict.faults[0].evidence.line


def test_nul_bytes_and_invalid_utf8() -> None:
    text = b"\xff\xfe\x00\x00garbage\x80\x81\n" + XID.replace(b"fallen", b"fal\x00len") + b"\n\xc3\x28\n"
    verdict = explain(text)
    assert verdict.category is Category.GPU_HARDWARE
    assert verdict.faults[0].evidence.line_number == 2


def test_binary_garbage_yields_no_fault() -> None:
    import random

    noise = random.Random(3).randbytes(2_000_000)
    verdict = explain(noise)
    assert verdict.category is None
    assert verdict.faults == ()


def test_empty_input() -> None:
    assert explain(b"").category is None
    assert explain("").faults == ()


def test_giant_line_is_cut_and_evidence_truncated() -> None:
    giant = b"x" * (3 * MAX_LINE_BYTES) + b" CUDA out of memory " + b"y" * 1000 + b"\n"
    blocks = list(read_blocks(io.BytesIO(giant + XID + b"\n")))
    assert max(len(block) for block in blocks) <= MAX_LINE_BYTES + 1
    verdict = explain(giant + XID + b"\n")
    categories = {f.category for f in verdict.faults}
    assert Category.GPU_MEMORY_OOM in categories
    assert Category.GPU_HARDWARE in categories
    assert all(len(f.evidence.line) < 2200 for f in verdict.faults)
    oom = next(f for f in verdict.faults if f.category is Category.GPU_MEMORY_OOM)
    assert "CUDA out of memory" in oom.evidence.line  # the window is around the match, not the line's start


def test_cri_format_lines_are_unwrapped() -> None:
    line = parse_line(b"2024-05-01T10:00:00.123456789Z stderr F [rank3]: KeyError: 'labels'")
    assert line.text == "KeyError: 'labels'"
    assert line.timestamp == "2024-05-01T10:00:00.123456789Z"
    assert line.rank == 3
    verdict = explain(b"2024-05-01T10:00:00.123456789Z stderr F KeyError: 'labels'\n")
    assert verdict.category is Category.USER_CODE


def test_block_boundaries_never_split_a_line() -> None:
    lines = [f"step {i} ok" for i in range(50_000)]
    lines[31_337] = XID.decode()
    verdict = explain("\n".join(lines))
    assert verdict.faults[0].evidence.line_number == 31_338
    blocks = list(read_blocks(io.BytesIO("\n".join(lines).encode()), block_bytes=4096))
    assert sum(block.count(b"\n") for block in blocks) == 49_999
    assert all(block.endswith(b"\n") for block in blocks[:-1])


def test_evidence_of_a_long_line_is_the_window_around_the_match() -> None:
    line = b"x" * 100_000 + b" torch.OutOfMemoryError: CUDA out of memory " + b"y" * 100_000 + b"\n"
    fault = explain(line).faults[0]
    assert "CUDA out of memory" in fault.evidence.line
    assert len(fault.evidence.line) < 2200
