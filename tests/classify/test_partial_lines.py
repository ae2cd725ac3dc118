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

from kcover.collect.lines import MAX_LINE_BYTES, clean_block
from kcover.collect.partial_lines import join_partial_lines, unfinished_at
from kcover.explain import explain, explain_paths
from kcover.faults import Category
from kcover.k8s.agent.tail import READ_LIMIT, Tailer
from kcover.steps import last_step

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


def two_streams() -> tuple[bytes, bytes]:
    """stderr's cut fault and a cut stdout line, their pieces interleaved: err P, out P, err F | out F."""
    err = records(straddling()).splitlines(keepends=True)
    out = records("o" * (PIECE + 4000), "stdout").splitlines(keepends=True)
    return err[0] + out[0] + err[1], out[1]


def step_lines(before: int) -> list[bytes]:
    """Step lines of a stdout up to ``before`` bytes."""
    steps: list[bytes] = []
    while sum(map(len, steps)) < before:
        steps.append(records(f"step {len(steps)} loss 2.{len(steps) % 10}", "stdout", second=len(steps) % 60))
    return steps


def test_a_line_finished_inside_another_streams_pieces_is_never_split_from_its_own(tmp_path: Path) -> None:
    first, second = two_streams()
    log = tmp_path / "0.log"
    log.write_bytes(b"".join(step_lines((1 << 20) - len(first) - 200)) + first + second + records("done", "stdout"))
    assert explain_paths([log]).category is Category.GPU_HARDWARE  # a block ends inside stdout's last piece
    log.write_bytes(first)
    tailer, texts = Tailer(), []
    for written in (b"", second):
        with log.open("ab") as out:
            out.write(written)
        for _ in range(2):
            if (found := tailer.read(log)) is not None:
                texts.append(join_partial_lines(clean_block(found[0])))
    assert any(ECC.encode() in text for text in texts)


def test_a_read_that_ends_inside_the_last_piece_waits_for_it(tmp_path: Path) -> None:
    """A backlog over the read limit cut inside the F record: that half record finishes nothing."""
    cut = records(straddling())
    first_piece = len(cut.splitlines(keepends=True)[0])
    log = tmp_path / "0.log"
    log.write_bytes(b"".join(step_lines(READ_LIMIT - first_piece - 100)) + cut + records("step 9999", "stdout"))
    tailer, texts = Tailer(), []
    for _ in range(4):
        if (found := tailer.read(log)) is not None:
            texts.append(join_partial_lines(clean_block(found[0])))
    assert any(ECC.encode() in text for text in texts)


def test_a_carriage_return_inside_a_piece_keeps_the_join_on_its_last_segment() -> None:
    """A progress bar redrawn in place, cut by the runtime: the next piece continues its last segment."""
    head = "Epoch 1:  50%|#####     | 5/10\r"
    data = records(head + straddling()[len(head) :])
    assert explain(data).category is Category.GPU_HARDWARE
    joined = join_partial_lines(clean_block(data))
    assert joined.count(b"\n") == clean_block(data).count(b"\n")


def test_a_progress_bar_in_pieces_never_holds_the_steps_back(tmp_path: Path) -> None:
    """CRI-O writes a piece for each write without a line break: a tqdm bar's every redraw.

    The agent holds a piece one poll and no more, so the step lines behind it
    reach the scanner (a hang detector would otherwise fire on a healthy job).
    """
    log = tmp_path / "0.log"
    log.write_bytes(b"")
    tailer, tick, steps = Tailer(), 0, 0
    for _ in range(20):  # 20 polls; two redraws between each, a step line every 10 redraws
        with log.open("ab") as out:
            for _ in range(2):
                tick += 1
                stamp = f"2026-12-01T10:00:{tick // 10 % 60:02d}.{tick % 10}00000000+00:00"
                out.write(f"{stamp} stderr P \r 37%|###7  | {tick}/100000 [01:02<01:46, 59.1it/s]\n".encode())
                if tick % 10 == 0:
                    out.write(f"{stamp} stdout F step {tick // 10} loss 1.93\n".encode())
        found = tailer.read(log)
        if found is not None and last_step(found[0]) is not None:
            steps += 1
    assert steps >= 3


def test_a_record_needs_its_tag_as_a_word() -> None:
    text = b"2026-12-01T10:00:00Z stderr Process 12 started\n2026-12-01T10:00:01Z stdout P piece\n"
    assert unfinished_at(text) == text.index(b"2026-12-01T10:00:01Z")
    assert join_partial_lines(text) == text


def test_a_block_that_opens_with_a_long_redrawn_progress_bar_is_still_joined() -> None:
    """A block may begin inside a record a carriage return split: 10 KiB of segments with no record header.

    The records near the block's end still say it is a container log.
    """
    segments = "\n".join(f" {n}%|####      | {n}/100 [00:0{n % 10}<01:00, 9.9it/s]" for n in range(250)) + "\n"
    block = segments.encode() + records(straddling()) + records("step 3", "stdout")
    assert len(segments) > 10_000
    assert ECC.encode() in join_partial_lines(block)


def test_a_cut_line_between_long_progress_bars_is_joined_whatever_the_block_edges(tmp_path: Path) -> None:
    """Epoch bars redrawn in place (one 15 KiB record of carriage returns each): blocks begin and end inside
    them, far from any record header; the stream is known for a container log from its first block."""
    def epoch(number: int) -> bytes:
        bar = "".join(f"\r Epoch {number}: {n // 3}%|###7  | {n}/300 [01:02<01:46, 59.1it/s]" for n in range(300))
        return records(bar)

    bars = b"".join(epoch(number) for number in range(70))
    for pad in (0, 37, 101):
        log = tmp_path / f"0-{pad}.log"
        log.write_bytes(bars + records("step 1", "stdout") * pad + records(straddling(), "stdout") + bars)
        assert explain_paths([log]).category is Category.GPU_HARDWARE


def test_joining_many_small_pieces_is_linear(tmp_path: Path) -> None:
    """CRI-O writes a piece per write without a line break (``print(x, end="", flush=True)``)."""
    def small(count: int) -> bytes:
        return b"".join(b"2026-12-01T10:00:00Z stdout P %d.\n" % n for n in range(count)) + \
            b"2026-12-01T10:00:01Z stdout F done\n"

    timings = []
    for count in (20_000, 80_000):
        block = small(count)
        began = time.perf_counter()
        joined = join_partial_lines(block)
        timings.append(time.perf_counter() - began)
        assert joined.count(b"\n") == block.count(b"\n")
    assert timings[1] < 8 * timings[0] + 0.05  # 4x the pieces: about 4x the time, never 16x


def test_the_agent_holds_a_piece_that_began_as_another_was_given(tmp_path: Path) -> None:
    log = tmp_path / "0.log"
    log.write_bytes(b"")
    tailer, texts = Tailer(), []

    def write_and_poll(data: bytes) -> None:
        with log.open("ab") as out:
            out.write(data)
        found = tailer.read(log)
        if found is not None:
            texts.append(join_partial_lines(clean_block(found[0])))

    write_and_poll(b"2026-12-01T10:00:00Z stdout P .\n")  # held one poll
    write_and_poll(b"2026-12-01T10:00:01Z stdout P .\n"  # stdout's pieces are given now, not stderr's new one
                   b"2026-12-01T10:00:01Z stderr P " + ECC.encode()[:40] + b"\n")
    write_and_poll(b"2026-12-01T10:00:01Z stderr F " + ECC.encode()[40:] + b"\n")
    write_and_poll(b"")
    assert any(ECC.encode() in text for text in texts)


def test_a_hold_never_outlives_its_file(tmp_path: Path) -> None:
    """The kubelet rotates while a piece is held: the new file's first piece is held in its own right."""
    log = tmp_path / "0.log"
    log.write_bytes(b"2026-12-01T10:00:00Z stdout P last words of the old file\n")
    tailer, texts = Tailer(), []

    def poll() -> None:
        found = tailer.read(log)
        if found is not None:
            texts.append(join_partial_lines(clean_block(found[0])))

    poll()  # held at offset 0
    log.rename(tmp_path / "0.log.20261201-100001")
    log.write_bytes(b"2026-12-01T10:00:02Z stderr P " + ECC.encode()[:40] + b"\n")
    poll()
    poll()
    with log.open("ab") as out:
        out.write(b"2026-12-01T10:00:02Z stderr F " + ECC.encode()[40:] + b"\n")
    poll()
    poll()
    assert any(ECC.encode() in text for text in texts)
    assert any(b"last words of the old file" in text for text in texts)
