"""Container log lines the runtime cut into pieces (``P`` records) are read whole again.

The pieces are written here as containerd writes them (16 KiB of text per
record, every piece but the last tagged ``P``); Docker's json-file cuts are
read through their CRI form.
"""

from __future__ import annotations

import json
import resource
import time
from pathlib import Path

from kcover.collect.lines import MAX_LINE_BYTES
from kcover.collect.partial_lines import join_partial_lines, unfinished_at
from kcover.explain import explain, explain_paths
from kcover.faults import Category
from kcover.k8s.agent.tail import READ_LIMIT, Tailer

PIECE = 16 * 1024
ILLEGAL = "CUDA error: an illegal memory access was encountered"
ECC = "RuntimeError: CUDA error: uncorrectable ECC error encountered"


def records(text: str, stream: str = "stderr", *, finished: bool = True, second: int = 0) -> bytes:
    """``text`` as containerd logs it: 16 KiB pieces, the last one ``F`` unless the line never ended."""
    data = text.encode()
    pieces = [data[at : at + PIECE] for at in range(0, len(data), PIECE)] or [b""]
    out = b""
    for index, piece in enumerate(pieces):
        tag = b"F" if finished and index == len(pieces) - 1 else b"P"
        out += b"2026-12-01T10:00:%02d.%06dZ %s %s " % (second, index, stream.encode(), tag) + piece + b"\n"
    return out


def straddling(fault: str = ECC, cut_after: str = "uncorrectable E") -> str:
    """A line whose fault text the runtime's 16 KiB cut splits just after ``cut_after``."""
    head = fault[: fault.index(cut_after) + len(cut_after)]
    return "x" * (PIECE - len(head) - 1) + " " + fault


def test_a_fault_cut_by_the_runtime_is_found_on_the_line_of_its_last_piece(tmp_path: Path) -> None:
    log = tmp_path / "0.log"
    log.write_bytes(records("step 1 loss 2.3", "stdout") + records(straddling()) + records("step 2", "stdout"))
    verdict = explain_paths([log])
    assert verdict.category is Category.GPU_HARDWARE
    assert verdict.root is not None
    evidence = verdict.root.evidence
    assert evidence.line_number == 3  # the file's line of the last piece: line numbers stay the file's
    assert "uncorrectable ECC error" in evidence.line


def test_without_the_join_the_cut_fault_is_missed() -> None:
    """What the join is for: no piece alone names the GPU's fault."""
    pieces = records(straddling()).splitlines()
    assert len(pieces) == 2 and pieces[0].endswith(b"uncorrectable E")
    for piece in pieces:
        assert explain(piece + b"\n").category is not Category.GPU_HARDWARE


def test_a_line_of_the_other_stream_between_the_pieces_keeps_its_place() -> None:
    cut = records(straddling()).splitlines(keepends=True)
    between = records("step 7 loss 1.9", "stdout")
    block = cut[0] + between + cut[1]
    joined = join_partial_lines(block)
    lines = joined.split(b"\n")
    assert joined.count(b"\n") == block.count(b"\n")
    assert lines[0] == b"" and lines[1] == between.rstrip(b"\n")
    assert lines[2].startswith(b"2026-12-01T10:00:00.000001Z stderr F xxx") and lines[2].endswith(ECC.encode())


def test_pieces_that_span_the_readers_blocks_are_joined(tmp_path: Path) -> None:
    steps: list[bytes] = []
    while sum(map(len, steps)) < (1 << 20) - PIECE // 2:  # the cut line's first piece lies across 1 MiB
        steps.append(records(f"step {len(steps)} loss 2.{len(steps) % 10}", "stdout", second=len(steps) % 60))
    filler = b"".join(steps)
    log = tmp_path / "0.log"
    log.write_bytes(filler + records(straddling()) + records("done", "stdout"))
    verdict = explain_paths([log])
    assert verdict.category is Category.GPU_HARDWARE and verdict.root is not None
    assert verdict.root.evidence.line_number == len(steps) + 2


def test_a_log_that_ends_in_pieces_gives_them_as_they_are() -> None:
    """containerd writes the last words of a container that died mid-line as ``P``: they still count."""
    log = records("step 1", "stdout") + records("RuntimeError: " + ILLEGAL, finished=False)
    assert unfinished_at(log) == len(records("step 1", "stdout"))
    assert join_partial_lines(log) == log
    assert explain(log).category is Category.CUDA_SOFTWARE


def test_a_docker_json_line_cut_in_pieces_is_joined() -> None:
    text = straddling() + "\n"
    pieces = [text[: PIECE], text[PIECE:]]
    entries = [{"log": piece, "stream": "stderr", "time": "2026-12-01T10:00:00.5Z"} for piece in pieces]
    lines = [json.dumps(entry, separators=(",", ":")) for entry in entries]  # as Docker writes them
    assert explain("\n".join(lines) + "\n").category is Category.GPU_HARDWARE


def test_endless_pieces_are_joined_in_bounded_lines_time_and_memory() -> None:
    """10 MiB of pieces of one line that never ends: joined lines stop at the line limit, what follows is read."""
    endless = records("z" * (10 << 20), finished=False)
    log = endless + records(ILLEGAL)
    joined = join_partial_lines(endless)
    assert max(len(line) for line in joined.split(b"\n")) <= MAX_LINE_BYTES + 64
    assert joined.count(b"\n") == endless.count(b"\n")
    began, peak_before = time.monotonic(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    verdict = explain(log)
    assert verdict.category is Category.CUDA_SOFTWARE
    assert time.monotonic() - began < 30
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak_before) / 1024
    assert grown_mb < 200


def test_what_only_looks_like_a_piece_is_left_alone() -> None:
    texts = [
        b"the P value was 0.03\nstdout P \n",  # no timestamp: no record
        b"2026-12-01T10:00:00Z stderr F whole line\n2026-12-01T10:00:01Z stdout F another\n",
        b"2026-12-01T10:00:00Z stdout X odd tag\n",
    ]
    for text in texts:
        assert join_partial_lines(text) == text and unfinished_at(text) is None


def test_the_agent_holds_pieces_back_until_the_last_one_is_written(tmp_path: Path) -> None:
    log = tmp_path / "0.log"
    cut = records(straddling()).splitlines(keepends=True)
    log.write_bytes(records("step 1", "stdout") + cut[0])
    tailer = Tailer()
    assert tailer.read(log) == (records("step 1", "stdout"), 1)  # the first piece waits
    with log.open("ab") as out:
        out.write(cut[1])
    assert tailer.read(log) == (cut[0] + cut[1], 2)  # then comes with its last piece, to be joined


def test_the_agent_gives_pieces_whose_file_stopped_growing(tmp_path: Path) -> None:
    """A container that died mid-line: its last piece is never followed by an ``F``."""
    log = tmp_path / "0.log"
    last_words = records("RuntimeError: " + ILLEGAL, finished=False)
    log.write_bytes(last_words)
    tailer = Tailer()
    assert tailer.read(log) is None  # held one poll
    assert tailer.read(log) == (last_words, 1)  # the file did not grow: given as it is
    assert tailer.read(log) is None


def test_the_agent_never_stalls_on_a_read_that_is_all_pieces(tmp_path: Path) -> None:
    log = tmp_path / "0.log"
    log.write_bytes(records("y" * (READ_LIMIT - 64 * 1024), finished=False))
    tailer = Tailer()
    assert tailer.read(log) is None
    with log.open("ab") as out:  # the writer goes on: the next read is a whole read limit of pieces
        out.write(records("y" * (5 * PIECE), finished=False))
    found = tailer.read(log)
    assert found is not None and found[1] == 1
