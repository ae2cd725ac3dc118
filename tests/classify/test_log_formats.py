"""The same log in the forms it reaches us in gets the same verdict.

A log is pasted into an issue as a quote or an indented block, exported with a timestamp on every
line (``kubectl logs --timestamps``, a logging handler), or read from a pod log
file that Docker wrote as JSON (``cri-dockerd``).  Each form is applied to every
excerpt of the own corpus and of the field corpus's tune half (never the
holdout): the category must not change.  Without the message-start parsing a
quoted or time-stamped traceback lost its final exception line (13 of the own
corpus's 229 excerpts changed), without the Docker unwrapping 13 did, and without taking an
indented block's indentation off 31 of 950 did (a traceback's exception line reads as its code).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from bench.corpus_accuracy import CORPUS, field_split, load_excerpts

from kcover.collect.lines import clean_block, dedent_blocks, docker_json_to_cri, parse_line
from kcover.explain import explain, explain_paths
from kcover.faults import Category

TRACEBACK = (
    'Traceback (most recent call last):\n  File "train.py", line 9, in <module>\n'
    "    batch = sample['labels']\nKeyError: 'labels'\n"
)


def quoted(text: str) -> str:
    return "\n".join("> " + line for line in text.splitlines())


def time_stamped(text: str) -> str:
    return "\n".join(f"2024-05-01T10:00:{i % 60:02d}.123456789Z {line}" for i, line in enumerate(text.splitlines()))


def logging_stamped(text: str) -> str:
    return "\n".join("[2024-05-01 10:00:00,123] [rank3]: " + line for line in text.splitlines())


def docker_json(text: str) -> str:
    entries = ({"log": line + "\n", "stream": "stderr", "time": "2024-05-01T10:00:00.123456789Z"}
               for line in text.splitlines())
    return "\n".join(json.dumps(entry, separators=(",", ":")) for entry in entries)


def indented(text: str, by: str = "    ") -> str:
    return "\n".join(by + line for line in text.splitlines())


FORMS: dict[str, Callable[[str], str]] = {
    "quoted": quoted,
    "indented-4": indented,
    "indented-tab": lambda text: indented(text, "\t"),
    "kubectl-timestamps": time_stamped,
    "logging-and-rank": logging_stamped,
    "docker-json": docker_json,
}


@pytest.fixture(scope="module")
def excerpts_and_verdicts() -> list[tuple[str, str, Category | None]]:
    excerpts = load_excerpts(CORPUS) + field_split("tune")
    return [(e.id, e.text, explain(e.text).category) for e in excerpts]


@pytest.mark.parametrize("form", sorted(FORMS))
def test_every_excerpt_keeps_its_verdict_in_each_form(
    form: str, excerpts_and_verdicts: list[tuple[str, str, Category | None]]
) -> None:
    changed = [
        f"{name}: {before} -> {after}"
        for name, text, before in excerpts_and_verdicts
        if (after := explain(FORMS[form](text)).category) != before
    ]
    assert len(excerpts_and_verdicts) > 500
    assert changed == []


def test_the_message_start_is_found_past_quotes_stamps_and_rank_tags() -> None:
    line = parse_line(b"> [2024-05-01 10:00:00,123] [rank3]: KeyError: 'labels'")
    assert line.message == "KeyError: 'labels'"
    assert line.text == "> [2024-05-01 10:00:00,123] [rank3]: KeyError: 'labels'"  # the evidence keeps it
    assert (line.timestamp, line.rank) == ("2024-05-01 10:00:00,123", 3)
    indented = parse_line(b"2024-05-01 10:00:00 |     raise KeyError('labels')")
    assert indented.message == "    raise KeyError('labels')"  # indentation tells code from the error
    plain = parse_line(b"2024-05-01 10:00:00")  # a stamp with nothing after it is not a prefix
    assert plain.message == "2024-05-01 10:00:00"


def test_the_evidence_is_the_whole_line_with_its_timestamp() -> None:
    verdict = explain(logging_stamped(TRACEBACK))
    assert verdict.category is Category.USER_CODE
    evidence = verdict.faults[0].evidence
    assert evidence.line == "[2024-05-01 10:00:00,123] [rank3]: KeyError: 'labels'"
    assert (evidence.rank, evidence.line_number) == (3, 4)


def test_a_docker_json_pod_log_file_reads_like_its_cri_twin(tmp_path: Path) -> None:
    path = tmp_path / "0.log"
    path.write_text(docker_json("step 1 loss 2.0\n" + TRACEBACK) + "\n")
    verdict = explain_paths([path])
    assert verdict.category is Category.USER_CODE
    evidence = verdict.faults[0].evidence
    assert (evidence.line, evidence.line_number) == ("KeyError: 'labels'", 5)
    assert evidence.timestamp == "2024-05-01T10:00:00.123456789Z"


def test_docker_escapes_colour_codes_and_cut_lines_are_undone() -> None:
    block = (
        b'{"log":"\\u001b[31mNCCL WARN \\"x\\"\\tcut","stream":"stdout","time":"2024-05-01T10:00:00Z"}\n'
        b'{"log":" here\\n","stream":"stdout","time":"2024-05-01T10:00:01Z"}\n'
    )
    assert clean_block(block) == (
        b'2024-05-01T10:00:00Z stdout P NCCL WARN "x"\tcut\n2024-05-01T10:00:01Z stdout F  here\n'
    )


@pytest.mark.parametrize(
    "line",
    [
        b'{"log":"no closing brace',  # cut by the block reader: left as it is
        b'{"log":5,"stream":"stdout"}',
        b'{"log":"x\\n"} trailing',
        b'{"log":"x\\n","time":"yesterday"} ',
        b'{"log":["x"]}',
    ],
)
def test_what_is_not_a_docker_line_is_left_alone_or_loses_only_its_wrapper(line: bytes) -> None:
    out = docker_json_to_cri(line + b"\nKeyError: 'labels'\n")
    assert out.endswith(b"\nKeyError: 'labels'\n")
    assert out.count(b"\n") == 2


def test_a_docker_line_without_a_usable_time_keeps_its_text() -> None:
    assert docker_json_to_cri(b'{"log":"KeyError: 1\\n","time":"yesterday"}') == b"KeyError: 1"
    assert docker_json_to_cri(b'{"log":"KeyError: 1\\n","stream":"x"}') == b"KeyError: 1"


def test_a_megabyte_docker_line_is_bounded_and_still_read() -> None:
    entry = {"log": "x" * (1 << 20) + " NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.\n",
             "stream": "stderr", "time": "2024-05-01T10:00:00Z"}
    verdict = explain(json.dumps(entry, separators=(",", ":")) + "\n")
    assert verdict.category is Category.GPU_HARDWARE


def test_an_indented_block_loses_only_the_indentation_its_lines_share() -> None:
    blocks = [b"    Traceback (most recent call last):\n", b'      File "x.py", line 1\n\n    KeyError: 1\n',
              b"  narrower: taken off in part\nflush left ends the block\n    kept as it is\n"]
    assert b"".join(dedent_blocks(blocks)) == (
        b'Traceback (most recent call last):\n  File "x.py", line 1\n\nKeyError: 1\n'
        b"narrower: taken off in part\nflush left ends the block\n    kept as it is\n")
    # a paste that begins inside a traceback keeps its frames' own indentation
    assert b"".join(dedent_blocks([b'      File "x.py"\n        x()\n    ValueError: bad\n'])) == (
        b'  File "x.py"\n    x()\nValueError: bad\n')
    # a log as a program writes it, even one that begins inside a traceback, is never changed
    tail = [b'  File "x.py", line 1\n    raise OSError("No space left on device")\nOSError: x\n', b"    y\n"]
    assert all(a is b for a, b in zip(dedent_blocks(tail), tail, strict=True))
    # a log as programs write it passes through as the same objects
    plain = [b"step 1\n", b"  indented later\n"]
    assert all(a is b for a, b in zip(dedent_blocks(plain), plain, strict=True))
    # mixed tabs and spaces are no shared indentation; a megabyte of blanks is read once
    assert b"".join(dedent_blocks([b"\tKeyError: 1\n    x\n"])) == b"\tKeyError: 1\n    x\n"
    huge = b" " * (1 << 20) + b"x\n"
    assert b"".join(dedent_blocks([huge, huge])) == b"x\nx\n"


def test_an_indented_traceback_keeps_its_line_numbers_and_evidence() -> None:
    verdict = explain(indented("step 1 loss 2.0\n" + TRACEBACK))
    assert verdict.category is Category.USER_CODE
    assert verdict.root is not None and verdict.root.evidence.line_number == 5
    assert verdict.root.evidence.line == "KeyError: 'labels'"


def test_a_log_that_begins_inside_a_traceback_keeps_its_frames() -> None:
    # a program's log read from the middle (tail, --tail, a rotated file): frames stay frames, code stays code
    text = ('  File "train.py", line 40, in save\n    raise OSError(errno.ENOSPC, "No space left on device")\n'
            "KeyError: 'scratch' (skipped, continuing)\n" + "".join(f"step {n} loss 2.{n}\n" for n in range(30)))
    verdict = explain(text)
    assert verdict.rule != "storage.no-space"  # the source line under a frame is code, not a message
    assert explain("log opened\n" + text).category == verdict.category  # nothing taken off
    assert explain(indented(text)).category == verdict.category


def test_an_indented_paste_with_a_line_cut_into_pieces_is_read_in_bounded_time() -> None:
    text = "    " + "y" * (3 << 20) + "\n" + indented(TRACEBACK) + "\n"
    started = time.perf_counter()
    verdict = explain(text)  # the cut line's pieces lack the indentation: the paste counts as ended there
    assert time.perf_counter() - started < 20
    assert verdict.category in (None, Category.USER_CODE)
