"""Accuracy on the labelled corpus of real-world excerpts (``tests/corpus``), held to the targets.

The corpus was written independently of the rules, from public documentation,
source and issue threads.  The same scoring code is ``python -m bench.corpus_accuracy``,
which prints the per-category table.
"""

from __future__ import annotations

from bench.corpus_accuracy import CORPUS, load_excerpts, score, score_scenarios

from kcover.faults import Category


def test_corpus_is_well_formed_and_large_enough() -> None:
    excerpts = load_excerpts()
    ids = [e.id for e in excerpts]
    assert len(ids) == len(set(ids))
    valid = {c.value for c in Category}
    assert all(e.category is None or e.category in valid for e in excerpts)
    assert len(excerpts) >= 150
    assert sum(e.category is None for e in excerpts) >= 30


def test_accuracy_meets_the_targets() -> None:
    scores = score(load_excerpts())
    assert scores.fatal_accuracy >= 0.85, scores.misses
    assert scores.false_alarm_rate <= 0.05, scores.misses
    assert scores.gpu_hardware_recall >= 0.95, scores.misses
    assert scores.node_precision >= 0.90, scores.misses


def test_every_multi_rank_scenario_is_attributed_right() -> None:
    right, total, problems = score_scenarios(CORPUS / "multirank")
    assert total >= 6
    assert right == total, problems
