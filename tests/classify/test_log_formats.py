"""The same log in the forms it reaches us in gets the same verdict.

A log is pasted into an issue as a quote or an indented block, copied from a web page (typographic
quotes, no-break spaces) or a terminal (trailing blanks), exported with a timestamp on every
line (``kubectl logs --timestamps``, a logging handler), read from a pod log
file that Docker wrote as JSON (``cri-dockerd``), or gathered from many workers by a launcher or
an aggregator that puts the worker's name before each line (Ray, pdsh,
``kubectl logs --prefix``, ``docker compose``).
Each form is applied to every excerpt of the own corpus and of the field corpus's tune half (never the
holdout): the category must not change.  Without the message-start parsing a
quoted or time-stamped traceback lost its final exception line (13 of the own
corpus's 229 excerpts changed), without the Docker unwrapping 13 did, and without taking an
indented block's indentation off 31 of 950 did (a traceback's exception line reads as its code),
without reading the launchers' and aggregators' prefixes 24 to 41 of 950 did in each of
their forms, with a web page's typographic quotes and no-break spaces 20, and with trailing blanks
(a terminal's copy pads lines with them) 5.
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
    entries = (
        {"log": line + "\n", "stream": "stderr", "time": "2024-05-01T10:00:00.123456789Z"} for line in text.splitlines()
    )
    return "\n".join(json.dumps(entry, separators=(",", ":")) for entry in entries)


def indented(text: str, by: str = "    ") -> str:
    return "\n".join(by + line for line in text.splitlines())


def prefixed(prefix: str) -> Callable[[str], str]:
    """Every line behind ``prefix``, as a launcher, log aggregator or logger writes it."""
    return lambda text: "\n".join(prefix + line for line in text.splitlines())


FORMS: dict[str, Callable[[str], str]] = {
    "quoted": quoted,
    "indented-4": indented,
    "indented-tab": lambda text: indented(text, "\t"),
    "kubectl-timestamps": time_stamped,
    "logging-and-rank": logging_stamped,
    "docker-json": docker_json,
    "web-typography": lambda text: text.replace("'", "\u2019").replace('"', "\u201d").replace("  ", "\u00a0 "),
    "trailing-blanks": lambda text: "\n".join(line + "  \t" for line in text.splitlines()),
    "ray-actor": prefixed("(RayTrainWorker pid=4123, ip=10.0.0.7) "),
    "pdsh-host": prefixed("worker-7: "),
    "pdsh-host-and-rank": prefixed("10.0.0.7: [rank3]: "),
    "kubectl-prefix": prefixed("[pod/trainer-worker-0/pytorch] "),
    "compose-service": prefixed("trainer-1  | "),
    "horovod-gloo": prefixed("[1]<stderr>:"),
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
    entry = {
        "log": "x" * (1 << 20) + " NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.\n",
        "stream": "stderr",
        "time": "2024-05-01T10:00:00Z",
    }
    verdict = explain(json.dumps(entry, separators=(",", ":")) + "\n")
    assert verdict.category is Category.GPU_HARDWARE


def test_an_indented_block_loses_only_the_indentation_its_lines_share() -> None:
    blocks = [
        b"    Traceback (most recent call last):\n",
        b'      File "x.py", line 1\n\n    KeyError: 1\n',
        b"  narrower: taken off in part\nflush left ends the block\n    kept as it is\n",
    ]
    assert b"".join(dedent_blocks(blocks)) == (
        b'Traceback (most recent call last):\n  File "x.py", line 1\n\nKeyError: 1\n'
        b"narrower: taken off in part\nflush left ends the block\n    kept as it is\n"
    )
    # a paste that begins inside a traceback keeps its frames' own indentation
    assert b"".join(dedent_blocks([b'      File "x.py"\n        x()\n    ValueError: bad\n'])) == (
        b'  File "x.py"\n    x()\nValueError: bad\n'
    )
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
    text = (
        '  File "train.py", line 40, in save\n    raise OSError(errno.ENOSPC, "No space left on device")\n'
        "KeyError: 'scratch' (skipped, continuing)\n" + "".join(f"step {n} loss 2.{n}\n" for n in range(30))
    )
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


@pytest.mark.parametrize(
    ("raw", "message", "rank", "node"),
    [
        (b"(RayTrainWorker pid=4123, ip=10.0.0.7) [rank1]: KeyError: 'x'", "KeyError: 'x'", 1, "10.0.0.7"),
        (b"(pid=4123) KeyError: 'x'", "KeyError: 'x'", None, None),
        (b"(raylet, ip=10.0.0.9) W0501 x", "W0501 x", None, "10.0.0.9"),
        (b'worker-1: [rank3]:   File "t.py", line 3', '  File "t.py", line 3', 3, "worker-1"),
        (b"ip-10-0-0-7.ec2.internal: KeyError: 'x'", "KeyError: 'x'", None, "ip-10-0-0-7.ec2.internal"),
        (b"[pod/train-0/pytorch] 2024-05-01T10:00:00Z KeyError: 'x'", "KeyError: 'x'", None, None),
        (b"Dec  1 10:00:00 gpu-7 kernel: NVRM: Xid 79", "kernel: NVRM: Xid 79", None, "gpu-7"),
        (b"10.0.0.7: NCCL WARN x", "NCCL WARN x", None, "10.0.0.7"),
        (b"[3]<stdout>:KeyError: 'x'", "KeyError: 'x'", 3, None),
    ],
)
def test_a_launcher_or_aggregator_prefix_tells_the_rank_or_node(
    raw: bytes, message: str, rank: int | None, node: str | None
) -> None:
    line = parse_line(raw)
    assert (line.message, line.rank, line.node) == (message, rank, node)
    assert line.text.endswith(message)  # the evidence keeps the prefix


@pytest.mark.parametrize(
    "raw",
    [
        b"eth0: link down",  # a device's name before a kernel or driver message is no host
        b"nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028",
        b"nvme0n1: I/O error, dev nvme0n1, sector 0",
        b"RuntimeError: NCCL error",  # an exception's name has no digit
        b"Epoch1: loss 0.3",  # a host's name is lowercase
        b"torch.distributed.elastic.multiprocessing.api: [WARNING] x",
        b"KeyError: 'x' 12: not a label",
        b"1: DOWN",  # /sys/class/infiniband/mlx5_0/ports/1/state, and srun --label's shape
        b"python3: can't open file '/w/train.py': [Errno 2] No such file or directory",
        b"s3fs: MOUNTPOINT /mnt/s3 is stale",
        b"mlx4: local QP operation err (QPN 000048)",
        b"node1: x",  # a host without a - is not told from a program
        b"ERROR:gcsfs:_request out of retries",
        b"F0501 10:00:00.123456  4123 a.cc:8] Check failed: x",  # a logger's head: its level tells fatal
    ],
)
def test_what_only_looks_like_a_host_or_task_prefix_is_left_alone(raw: bytes) -> None:
    line = parse_line(raw)
    assert (line.message, line.node) == (raw.decode(), None)


def test_a_node_named_by_a_pdsh_prefix_is_the_faults_node() -> None:
    log = "\n".join("gpu-node-3: " + line for line in TRACEBACK.splitlines())
    log += "\ngpu-node-5: NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.\n"
    verdict = explain(log)
    assert verdict.category is Category.GPU_HARDWARE
    assert verdict.nodes == ("gpu-node-5",)


def test_journalctl_kernel_lines_name_their_host() -> None:
    log = (
        "Dec 01 10:00:00 gpu-node-5 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.\n"
        "Dec 01 10:00:01 gpu-node-5 systemd-oomd[812]: Killed /system.slice/train.scope due to memory pressure"
        " for /system.slice being 81.42% > 60.00% for > 20s with reclaim activity\n"
    )
    verdict = explain(log)
    assert (verdict.category, verdict.nodes) == (Category.GPU_HARDWARE, ("gpu-node-5",))
    assert {fault.rule for fault in verdict.faults} >= {"host.oom-killer"}  # the program's name is still read


@pytest.mark.parametrize(
    ("log", "category"),
    [
        ("Dec 01 10:00:00 Segmentation fault (core dumped)\n", Category.HOST_SYSTEM),  # `ts`: no host there
        ("Dec 01 10:00:00 CUDA error: uncorrectable ECC error encountered\n", Category.GPU_HARDWARE),
        ("Dec 01 10:00:00 localhost kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.\n",
         Category.GPU_HARDWARE),
        ("(RayTrainWorker pid=4123, ip=10.0.0.7) RuntimeError: CUDA error: uncorrectable ECC error encountered"
         " [repeated 7x across cluster]\n", Category.GPU_HARDWARE),  # Ray's summary of several nodes' lines
        ("(raylet, ip=10.0.0.9) RuntimeError: CUDA error: uncorrectable ECC error encountered"
         " [repeated 3x across cluster]\n", Category.GPU_HARDWARE),
        ("run-gpt3.sh: line 12: 81234 Killed                  python train.py\n", Category.HOST_SYSTEM),
    ],
)
def test_what_names_no_node_blames_none(log: str, category: Category) -> None:
    verdict = explain(log)
    assert (verdict.category, verdict.nodes) == (category, ())


def test_a_loggers_level_is_no_compose_service() -> None:
    log = "INFO     | step 100 loss 2.31\nCRITICAL | trainer.py:88 - Storage backend rejected shard 17, giving up\n"
    assert explain(log).rule == "job.unrecognised-failure"  # the fatal level is still read
    assert parse_line(b"trainer-1  | CRITICAL | x").message == "CRITICAL | x"


def test_a_megabyte_of_prefix_like_text_is_read_in_bounded_time() -> None:
    for raw in (b"(pid=1 " * 150_000, b"a1" * 500_000 + b": x", b"[1]<stderr>:" * 90_000, b" 1: " * 250_000):
        started = time.perf_counter()
        parse_line(raw)
        assert time.perf_counter() - started < 1.0
