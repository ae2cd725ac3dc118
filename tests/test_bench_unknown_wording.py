"""``bench.unknown_wording`` counts what it says: a hand-checked corpus of four excerpts.

The generic matcher keeps no rule that names a layer, and the score puts the
generic category back for the baseline: an exception whose words name NCCL is
right only with the vocabulary, a ``KeyError`` is right both ways, and so is a bare
``Exception`` (no rule: the fallback's ``other``), a ``RuntimeError`` that names no
layer is wrong both ways for a GPU fault, and a healthy log gets no verdict.
"""

from __future__ import annotations

from bench.corpus_accuracy import Excerpt
from bench.unknown_wording import GENERIC_CATEGORY, generic_matcher, score
from tests.classify.test_fallback import STEPS, TRACEBACK

from kcover.classify.exit_codes import FALLBACK_RULE
from kcover.explain import explain


def test_the_generic_matcher_keeps_only_rules_that_name_no_layer() -> None:
    matcher = generic_matcher()
    assert {rule.id for rule in matcher.rules} >= {"python.exception", FALLBACK_RULE}
    for rule in matcher.rules:
        assert rule.id in GENERIC_CATEGORY or rule.id == FALLBACK_RULE or rule.spec.exit_codes, rule.id
    verdict = explain("RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB\n", matcher=matcher)
    assert verdict.rule == "python.exception"


def test_the_score_of_a_hand_checked_corpus() -> None:
    excerpts = [
        Excerpt("nccl", "nccl_communication", False,
                STEPS + TRACEBACK + "RuntimeError: NCCL communicator was torn down by a peer\n"),
        Excerpt("user", "user_code", False, STEPS + TRACEBACK + "KeyError: 'labels'\n"),
        Excerpt("other", "other", False, STEPS + TRACEBACK + "Exception: boom\n"),
        Excerpt("gpu", "gpu_hardware", True, STEPS + TRACEBACK + "RuntimeError: shard 3 failed\n"),
        Excerpt("healthy", None, None, STEPS),
    ]
    fatal, vocabulary_right, baseline_right, benign, alarms = score(excerpts, generic_matcher())
    assert (fatal, vocabulary_right, baseline_right, benign, alarms) == (4, 3, 2, 1, 0)
