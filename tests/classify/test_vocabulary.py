"""The layer vocabulary: the words of a failure line name a layer when no rule knows the sentence.

The table itself (every example recognised as its layer, no counter-example,
patterns refused when they could backtrack), the order of the layers where one
line names two, and the verdicts it changes end to end: an unrecognised
failure and a generic exception take the named category but keep their retry
budget and never blame a node, a pasted last line that names a layer is a
verdict, and an informational or corrected line is not.
"""

from __future__ import annotations

import time

import pytest
import yaml
from tests.classify.test_fallback import STEPS, TRACEBACK, tail_of

from kcover import Action, Category, explain
from kcover.classify.fallback import failure_line
from kcover.classify.vocabulary import MATCH_CHARS, Layer, layer_of, parse_vocabulary, shipped_vocabulary
from kcover.decide.policy import AttemptEnd, DecisionKind, RecoveryPolicy, RecoveryState, decide
from kcover.faults import GENERIC_EXCEPTION_RULE, UNRECOGNISED_FAILURE_RULE

LAYERS = shipped_vocabulary().layers
LAST_LINE = {"failure": ["failed"], "examples": ["NCCL failed"]}


@pytest.mark.parametrize("layer", LAYERS, ids=lambda layer: layer.spec.category.value)
def test_every_example_names_its_layer_and_no_counter_example_does(layer: Layer) -> None:
    spec = layer.spec
    for example in spec.examples:
        assert layer_of([example]) is spec.category, example
    for counter in spec.counter_examples:
        assert layer_of([counter]) is not spec.category, counter


@pytest.mark.parametrize(
    ("line", "category"),
    [
        # the layer that failed first, not the one that reports it
        ("NCCL WARN Cuda failure 'initialization error'", Category.CUDA_SOFTWARE),
        ("ProcessGroupNCCL's watchdog got stuck for 600 seconds; this indicates a NCCL/CUDA API hang",
         Category.COLLECTIVE_TIMEOUT_HANG),
        ("fi_mr_reg failed, ret is:-12, Cannot allocate memory", Category.NETWORK_INFINIBAND),
        ("RuntimeError: CUDA error: uncorrectable ECC error encountered", Category.GPU_HARDWARE),
        ("RuntimeError: NCCL error: unhandled cuda error", Category.CUDA_SOFTWARE),
        ("RuntimeError: NCCL error in: NCCLUtils.hpp:275, invalid usage", Category.USER_CODE),
        ("srun: error: node107: task 0: Out Of Memory", Category.HOST_SYSTEM),
        ("Unable to write to EQ: err: Input/output error (5) prov/efa", Category.NETWORK_INFINIBAND),
        # a socket error of a web request is a side service's, not the fabric's
        ("requests.exceptions.ConnectionError: Connection refused for url https://example.com/model", None),
        # a programming mistake keeps its category whatever device it mentions
        ("TypeError: can't convert cuda:0 device type tensor to numpy", None),
        ("RuntimeError: Expected all tensors to be on the same device, but found cuda:0 and cpu", None),
        ("RuntimeError: shape '[4, 8]' is invalid for input of size 30", None),
    ],
)
def test_the_first_failing_layer_is_named(line: str, category: Category | None) -> None:
    assert layer_of([line]) is category


def test_the_lines_after_the_evidence_are_read_only_when_it_names_no_layer() -> None:
    assert layer_of(["terminate called after throwing an instance of 'c10::Error'",
                     "  what():  NCCL communicator was aborted"]) is Category.NCCL_COMMUNICATION
    assert layer_of(["ValueError: bad config", "NCCL communicator was aborted"]) is None
    assert layer_of([]) is None


def test_only_the_head_of_a_long_line_is_read_and_quickly() -> None:
    hostile = ["1" * (1 << 20), " " * (1 << 20), "a" * (1 << 20), "NCCL" * (1 << 18), "timeout " * (1 << 17)]
    start = time.perf_counter()
    for line in hostile:
        layer_of([line])
    assert time.perf_counter() - start < 5.0
    assert layer_of(["x" * MATCH_CHARS + " NCCL error"]) is None
    assert layer_of(["x" * (MATCH_CHARS - 20) + " NCCL error"]) is Category.NCCL_COMMUNICATION


def test_a_pattern_that_could_backtrack_is_refused_naming_the_layer() -> None:
    table = {
        "layers": [{"category": "nccl_communication", "words": [r"(\w+\s?)*NCCL"], "examples": ["NCCL"]}],
        "last_line": LAST_LINE,
    }
    with pytest.raises(ValueError, match=r"vocabulary\.yaml: nccl_communication: pattern .* (repeat|nested)"):
        parse_vocabulary(yaml.safe_dump(table))


def test_a_table_without_examples_or_with_an_unknown_category_is_refused() -> None:
    with pytest.raises(ValueError):
        parse_vocabulary(yaml.safe_dump({"layers": [{"category": "nccl_communication", "words": ["NCCL"]}]}))
    with pytest.raises(ValueError):
        parse_vocabulary(yaml.safe_dump({"layers": [{"category": "gpu", "words": ["x"], "examples": ["x"]}]}))


UNKNOWN_NCCL = "RuntimeError: NCCL communicator was torn down while rank 3 was still sending\n"


def test_a_generic_exception_takes_the_layer_but_keeps_the_user_code_budget() -> None:
    verdict = explain(STEPS + TRACEBACK + UNKNOWN_NCCL)
    assert verdict.rule == GENERIC_EXCEPTION_RULE
    assert verdict.category is Category.NCCL_COMMUNICATION
    assert verdict.root is not None and "its words name nccl_communication" in verdict.root.title
    assert not verdict.node_at_fault and verdict.nodes == ()
    policy = RecoveryPolicy(max_restarts=5, user_code_retries=1)
    first, state = decide(policy, RecoveryState(), AttemptEnd(verdict, ("node-0",)))
    assert first.kind is DecisionKind.RESTART
    second, _ = decide(policy, state, AttemptEnd(verdict, ("node-0",)))
    assert second.kind is DecisionKind.FAIL and "seen 2 times" in second.reason


def test_a_programming_error_stays_user_code() -> None:
    verdict = explain(STEPS + TRACEBACK + "ValueError: Expected a cuda device, but got: cpu\n")
    assert verdict.rule == GENERIC_EXCEPTION_RULE and verdict.category is Category.USER_CODE


def test_an_unrecognised_failure_takes_the_layer_its_what_line_names() -> None:
    text = STEPS + (
        "terminate called after throwing an instance of 'c10::Error'\n"
        "  what():  the NCCL communicator of group 7 was poisoned by a peer\n"
        "Exception raised from run at /opt/src/comm.cpp:88 (most recent call first):\n"
        "frame #0: c10::Error::Error() + 0x7d\n"
    )
    verdict = explain(text)
    assert verdict.rule == UNRECOGNISED_FAILURE_RULE
    assert verdict.category is Category.NCCL_COMMUNICATION
    assert verdict.action is Action.RESTART and not verdict.node_at_fault


@pytest.mark.parametrize(
    ("last", "category"),
    [
        ("mlx5_core 0000:17:00.0: RDMA device entered an unrecoverable state\n", Category.NETWORK_INFINIBAND),
        ("gpu-node-3 kernel: NVRM: GPU 0000:81:00.0: adapter bring-up failed (0x25:0x40)\n", Category.GPU_HARDWARE),
    ],
)
def test_a_pasted_last_line_that_names_a_layer_is_a_verdict(last: str, category: Category) -> None:
    verdict = explain(STEPS + last)
    assert verdict.rule == UNRECOGNISED_FAILURE_RULE, verdict.reason
    assert verdict.category is category
    assert verdict.root is not None and verdict.root.evidence.line == last.strip()
    assert verdict.action is Action.RESTART and not verdict.node_at_fault


@pytest.mark.parametrize(
    "text",
    [
        "node:22:22 [1] NCCL INFO NET/Plugin: Failed to find ncclCollNetPlugin_v8 symbol.\n",
        "pcieport 0000:00:03.1: PCIe Bus Error: severity=Corrected, type=Physical Layer\n",
        "        Uncorrectable Error               : 0\n",
        "[W socket.cpp:601] [c10d] The client socket has failed to connect to [host]:22456 (errno: 22).\n",
        "NCCL connection to rank 4 failed, retrying in 2 s\n",
        "mlx5_0 port 1 link down\nstep 100 loss 2.5\n",  # the job went on
        "RDMA device mlx5_0 is up, 4 ports active\n",  # a layer without a failure word
        "the checkpoint upload failed once\n",  # a failure word without a layer
    ],
)
def test_informational_recovered_or_plain_last_lines_are_not_a_verdict(text: str) -> None:
    assert failure_line(tail_of(STEPS + text)) is None
    assert explain(STEPS + text).rule != UNRECOGNISED_FAILURE_RULE


def test_a_long_last_line_is_read_in_bounded_time() -> None:
    long_line = "NVRM: GPU adapter bring-up failed " + "x" * 12_000 + "\n"  # inside the kept tail
    assert explain(STEPS + long_line).category is Category.GPU_HARDWARE
    start = time.perf_counter()
    verdict = explain(STEPS + "NVRM: failed " + "x" * (1 << 20) + "\n")  # longer than the tail: cut away
    assert time.perf_counter() - start < 10.0
    assert verdict.rule in (None, UNRECOGNISED_FAILURE_RULE)
