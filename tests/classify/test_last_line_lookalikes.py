"""The last-line rule against healthy output that looks like failure.

A log whose last line says something failed in a layer's words is a verdict
(:func:`kcover.classify.fallback.failure_line`).  Healthy tools print many
such lines without anything failing: ``nvidia-smi -q``'s ``Uncorrectable
Error : N/A``, a health script's ``0 failed``, PyTorch's ``[W310 …]`` socket
warning behind an ``srun`` prefix, an option's help, a shell trace of a grep.
``lookalike_last_lines.yaml`` holds some two hundred of them, written in the
formats of the real tools, and a few real failure lines that must still count.
A look-alike may still meet a catalog rule whose sentence is a real sign
(:data:`CATALOG_SIGNS`, each with the reason); every other one gets no verdict.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.classify.test_fallback import STEPS, tail_of

from kcover import Action, explain
from kcover.classify.fallback import failure_line, strip_stamp
from kcover.classify.vocabulary import layer_of, says_failed, shipped_vocabulary

TABLE: dict[str, Any] = yaml.safe_load((Path(__file__).parent / "lookalike_last_lines.yaml").read_text())

CATALOG_SIGNS = {
    "dmesg Xid 63 row remap (informational)": "xid.63.row-remap-event",  # a degraded sign, no action
    "TF cuInit on CPU-only host": "cuda.no-device",  # a GPU job without a GPU did fail
    "kubectl event FailedScheduling warning": "k8s.scheduling",  # the pod cannot start
    "Lustre reconnect noise": "storage.stale-or-disconnected",  # one line cannot tell a retried connect
    "k8s describe pod last state (earlier restart)": "process.abnormal-exit",  # the container did exit 1
    "kubectl port-forward noise": "process.abnormal-exit",  # an exit status 1 in the line, kept as other
    "k8s Job condition message": "k8s.deadline",  # the Job did reach its backoff limit
    "dmesg mlx5 health poll": "ib.port-down",  # the NIC's firmware stopped answering
}


def _log(lines: list[str]) -> str:
    return STEPS + "\n".join(lines) + "\n"


@pytest.mark.parametrize("item", TABLE["lookalikes"], ids=lambda item: item["note"])
def test_healthy_output_is_never_a_last_line_verdict(item: dict[str, Any]) -> None:
    text = _log(item["lines"])
    if item["note"] not in CATALOG_SIGNS:
        assert failure_line(tail_of(text)) is None
    verdict = explain(text)
    assert verdict.rule == CATALOG_SIGNS.get(item["note"]), verdict.reason


@pytest.mark.parametrize("item", TABLE["failures"], ids=lambda item: item["note"])
def test_a_real_failure_as_the_last_line_is_still_a_verdict(item: dict[str, Any]) -> None:
    verdict = explain(_log(item["lines"]))
    assert verdict.category is not None and verdict.action is not Action.NONE, item["lines"][-1]


def test_the_tables_examples_say_failed_and_its_counter_examples_do_not() -> None:
    spec_text = (Path(__file__).parents[2] / "src/kcover/classify/vocabulary.yaml").read_text()
    last_line = yaml.safe_load(spec_text)["last_line"]
    assert last_line["examples"] and last_line["counter_examples"]
    for example in last_line["examples"]:
        assert says_failed(example), example
    for counter in last_line["counter_examples"]:
        assert not says_failed(counter), counter


def test_the_shapes_not_luck_keep_the_look_alikes_out() -> None:
    # most look-alikes do hold a failure word: the not_failure shapes, then the layer words, stop them
    lasts = [item["lines"][-1] for item in TABLE["lookalikes"] if item["note"] not in CATALOG_SIGNS]
    worded = [last for last in lasts if any(word.search(last) for word in shipped_vocabulary().failure)]
    assert len(worded) >= 40
    still_failed = [last for last in worded if says_failed(last)]
    assert len(still_failed) < len(worded) // 4
    assert [last for last in still_failed if layer_of([strip_stamp(last)]) is not None] == []
