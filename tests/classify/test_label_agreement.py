"""The second-labeller files of the field corpus and the agreement figure computed from them.

Agreement between two labellers bounds what the holdout accuracy can mean
(``python -m bench.label_agreement``); these tests keep its inputs honest: every second label
names an excerpt that exists, a valid category and a node verdict exactly when fatal, and every
adjudicated excerpt is one the two labellers disagreed on.
"""

from __future__ import annotations

import math

import pytest
from bench.corpus_accuracy import FIELD, load_excerpts
from bench.label_agreement import AGREEMENT, cohen_kappa, load_labels

from kcover.faults import Category


def test_cohen_kappa_matches_the_textbook_example() -> None:
    # 50 items: both yes 20, first yes / second no 5, first no / second yes 10, both no 15:
    # observed 0.7, chance 0.5 * 0.6 + 0.5 * 0.4 = 0.5, kappa 0.4.
    pairs = [("y", "y")] * 20 + [("y", "n")] * 5 + [("n", "y")] * 10 + [("n", "n")] * 15
    assert cohen_kappa(pairs) == pytest.approx(0.4)
    assert cohen_kappa([("a", "a"), ("b", "b")]) == 1.0
    assert cohen_kappa([("a", "b"), ("b", "a")]) == pytest.approx(-1.0)
    assert math.isnan(cohen_kappa([]))


@pytest.mark.parametrize("name", ["second.yaml", "adjudicated.yaml"])
def test_agreement_labels_name_real_excerpts_and_valid_categories(name: str) -> None:
    path = AGREEMENT / name
    if not path.is_file():
        pytest.skip(f"{path} not written yet")
    ids = {e.id for e in load_excerpts(FIELD)}
    valid = {c.value for c in Category}
    labels = load_labels(path)
    assert labels, f"{path} is empty"
    for excerpt_id, label in labels.items():
        assert excerpt_id in ids, f"{name}: {excerpt_id} is not a field excerpt"
        assert label.category is None or label.category in valid, f"{name}: {excerpt_id}"
        assert (label.category is None) == (label.node_at_fault is None), f"{name}: {excerpt_id}"


def test_only_disagreements_are_adjudicated() -> None:
    second, adjudicated = load_labels(AGREEMENT / "second.yaml"), load_labels(AGREEMENT / "adjudicated.yaml")
    if not adjudicated:
        pytest.skip("no adjudication written yet")
    first = {e.id: e.category for e in load_excerpts(FIELD)}
    for excerpt_id in adjudicated:
        assert excerpt_id in second and second[excerpt_id].category != first[excerpt_id], excerpt_id
