"""Slurm's ``srun --label`` logs: the task number before each line is read as the rank, per log.

Every excerpt of the own corpus and of the field corpus's tune half (never the holdout) with two
lines or more keeps its verdict when every line carries a task label, as ``srun -l`` writes it;
before the labels were read, a task label hid an exception line's start.  A one-line log cannot be
told from a program's own numbered line and is left as it is.  The hostile side: numbered
listings, ``ip addr``, ``/proc/interrupts``, a sysfs port state and a PID-less log keep their
text; a label of another width is not a label of this log.
"""

from __future__ import annotations

import io
from collections.abc import Callable

import pytest
from bench.corpus_accuracy import CORPUS, field_split, load_excerpts

from kcover.collect.lines import parse_line, read_blocks
from kcover.collect.task_labels import DECIDING_BYTES, read_task_labels
from kcover.explain import explain
from kcover.faults import Category

TRACEBACK = (
    'Traceback (most recent call last):\n  File "train.py", line 9, in <module>\n'
    "    batch = sample['labels']\nKeyError: 'labels'\n"
)


def labelled(label: Callable[[int], str]) -> Callable[[str], str]:
    """Every line of a text behind the label ``label(line_index)`` gives it."""
    return lambda text: "\n".join(label(index) + line for index, line in enumerate(text.splitlines()))


SRUN_FORMS: dict[str, Callable[[str], str]] = {
    "one-task": labelled(lambda _: "0: "),
    "padded": labelled(lambda _: " 3: "),  # 16 tasks: srun pads to the widest number
    "two-tasks-interleaved": labelled(lambda index: f"{index % 2:>3}: "),
}


def relabelled(text: str, chunk: int = 1 << 20) -> str:
    stream = io.BytesIO(text.encode())
    return b"".join(read_task_labels(read_blocks(stream, chunk))).decode()


def read_lines(text: str) -> list[tuple[int | None, str]]:
    """Each line of a log as the scanner reads it: its rank and its message."""
    return [((line := parse_line(raw.encode())).rank, line.message) for raw in relabelled(text).splitlines()]


@pytest.fixture(scope="module")
def multi_line_excerpts() -> list[tuple[str, str, Category | None]]:
    excerpts = load_excerpts(CORPUS) + field_split("tune")
    several = [e for e in excerpts if sum(1 for line in e.text.splitlines() if line.strip()) >= 2]
    assert len(several) > 0.8 * len(excerpts)  # 143 of 1,032 are one line
    return [(e.id, e.text, explain(e.text).category) for e in several]


@pytest.mark.parametrize("form", sorted(SRUN_FORMS))
def test_every_excerpt_keeps_its_verdict_behind_srun_labels(
    form: str, multi_line_excerpts: list[tuple[str, str, Category | None]]
) -> None:
    changed = [
        f"{name}: {before} -> {after}"
        for name, text, before in multi_line_excerpts
        if (after := explain(SRUN_FORMS[form](text)).category) != before
    ]
    assert len(multi_line_excerpts) > 500
    assert changed == []


def test_the_task_label_is_the_rank_and_srun_own_lines_pass() -> None:
    log = labelled(lambda _: " 3: ")(TRACEBACK) + "\nsrun: error: gpu-01: task 3: Exited with exit code 1\n"
    verdict = explain(log)
    assert (verdict.category, verdict.ranks) == (Category.USER_CODE, (3,))
    assert verdict.root is not None and verdict.root.evidence.line_number == 4
    assert verdict.root.evidence.line == "KeyError: 'labels'"  # the mark is never shown
    assert read_lines(log)[-1] == (None, "srun: error: gpu-01: task 3: Exited with exit code 1")


def test_two_tasks_tracebacks_interleaved_name_both_ranks() -> None:
    first = [" 0: " + line for line in TRACEBACK.splitlines()]
    second = ["12: " + line for line in TRACEBACK.replace("KeyError: 'labels'", "ValueError: empty batch").splitlines()]
    log = "\n".join(line for pair in zip(first, second, strict=True) for line in pair)
    assert {fault.rank for fault in explain(log).faults} == {0, 12}


def test_the_head_decides_even_when_the_log_arrives_in_small_pieces() -> None:
    log = labelled(lambda _: "1: ")(TRACEBACK)
    assert relabelled(log, chunk=7) == relabelled(log)
    assert read_lines(log)[0] == (1, "Traceback (most recent call last):")


def test_a_script_before_srun_does_not_hide_the_labels() -> None:
    log = "+ srun -l python train.py\nstarting\n" + labelled(lambda _: "2: ")(TRACEBACK * 2)
    head = [(None, "+ srun -l python train.py"), (None, "starting"), (2, "Traceback (most recent call last):")]
    assert read_lines(log)[:3] == head


def test_only_the_logs_width_is_a_label() -> None:
    log = labelled(lambda _: " 5: ")(TRACEBACK) + "\n123: not a label of this log\n  : nor this\n5 : nor this\n"
    left = [(None, "123: not a label of this log"), (None, "  : nor this"), (None, "5 : nor this")]
    assert read_lines(log)[-3:] == left
    assert "\x00" not in relabelled(log).split("KeyError")[-1]  # no mark is left where no label is read


def test_only_the_head_decides() -> None:
    head = "plain output line\n" * (DECIDING_BYTES // 18 + 1)
    log = head + labelled(lambda _: "0: ")(TRACEBACK)
    assert relabelled(log) == log


def test_every_task_printing_the_same_line_once_is_labelled() -> None:
    log = "".join(f"{task:>2}: RuntimeError: NCCL error: unhandled system error\n" for task in range(12))
    assert read_lines(log)[11] == (11, "RuntimeError: NCCL error: unhandled system error")


@pytest.mark.parametrize(
    "log",
    [
        "4: ACTIVE\n4: ACTIVE\n1: DOWN\n4: ACTIVE\n",  # cat /sys/class/infiniband/*/ports/1/state: values, not output
        "5: LinkUp\n5: LinkUp\n2: Polling\n",  # .../phys_state
        "1: DOWN\n1: DOWN\n",
    ],
)
def test_port_states_of_several_devices_keep_their_verdict(log: str) -> None:
    assert relabelled(log) == log
    assert explain(log).category is Category.NETWORK_INFINIBAND


def test_a_heterogeneous_jobs_component_labels_are_not_read() -> None:
    # P0's task 0 and P1's task 0 are different processes: one rank for both would merge them
    log = "P0 0: loading shard 1\nP1 0: loading shard 2\nP0 0: KeyError: 'labels'\nP1 0: ValueError: empty\n"
    assert relabelled(log) == log


@pytest.mark.parametrize(
    "log",
    [
        "1: DOWN\n",  # a sysfs port state, one line: cannot be told
        "1: first step\n2: second step\n3: third step\n",  # a numbered listing: each number once
        "1: lo: <LOOPBACK,UP,LOWER_UP> mtu 65536 qdisc noqueue state UNKNOWN\n"
        "    link/loopback 00:00:00:00:00:00 brd 00:00:00:00:00:00\n"
        "2: ib0: <BROADCAST,MULTICAST> mtu 2044 qdisc mq state DOWN\n"
        "    link/infiniband 80:00:02:08:fe:80 brd 00:ff:ff:ff:ff:12\n",  # ip addr
        "  0:         45   IO-APIC   2-edge      timer\n  1:          0   IO-APIC   1-edge      i8042\n"
        "  8:          1   IO-APIC   8-edge      rtc0\n",  # /proc/interrupts
        "0: a\n10: b\n0: c\n10: d\n",  # numbers of two widths: no padding, no srun
        "",
        "\n\n\n",
    ],
)
def test_what_only_looks_like_task_labels_is_left_alone(log: str) -> None:
    assert relabelled(log) == log


def test_a_sysfs_port_state_keeps_its_verdict() -> None:
    assert explain("1: DOWN\n").category is Category.NETWORK_INFINIBAND


def test_a_megabyte_line_without_a_break_is_passed_through() -> None:
    log = "0: " + "x" * (1 << 20)
    as_read = b"".join(read_blocks(io.BytesIO(log.encode()))).decode()  # cut into pieces, as any long line
    assert relabelled(log) == as_read
