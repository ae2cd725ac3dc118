"""The second-labeller files of the field corpus and the agreement figures computed from them.

Agreement between two labellers bounds what the holdout accuracy can mean
(``python -m bench.label_agreement``); these tests keep its inputs honest (every second label
names an excerpt that exists, once, with a valid category and a node verdict exactly when fatal;
every disagreement, and only a disagreement, is adjudicated) and check the figures against a
hand-computed example.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml
from bench import label_agreement
from bench.corpus_accuracy import FIELD, Excerpt, load_excerpts
from bench.label_agreement import AGREEMENT, Label, cohen_kappa, load_labels, report

from kcover.faults import Category

FILES = ("second.yaml", "adjudicated.yaml")


def test_cohen_kappa_matches_the_textbook_example() -> None:
    # 50 items: both yes 20, first yes / second no 5, first no / second yes 10, both no 15:
    # observed 0.7, chance 0.5 * 0.6 + 0.5 * 0.4 = 0.5, kappa 0.4.
    pairs = [("y", "y")] * 20 + [("y", "n")] * 5 + [("n", "y")] * 10 + [("n", "n")] * 15
    assert cohen_kappa(pairs) == pytest.approx(0.4)
    assert cohen_kappa([("a", "a"), ("b", "b")]) == 1.0
    assert cohen_kappa([("a", "b"), ("b", "a")]) == pytest.approx(-1.0)
    assert cohen_kappa([("a", "a")] * 3) == 1.0  # chance agreement 1: both raters use one category
    # A category only the second rater uses: observed 2/4, chance (2*1 + 2*1) / 16 = 0.25, kappa 1/3.
    assert cohen_kappa([("a", "a"), ("b", "b"), ("a", "c"), ("b", "c")]) == pytest.approx(1 / 3)
    assert math.isnan(cohen_kappa([]))


@pytest.mark.parametrize("name", FILES)
def test_agreement_labels_name_real_excerpts_once_with_valid_categories(name: str) -> None:
    path = AGREEMENT / name
    assert path.is_file(), f"{path} is missing: bench.label_agreement would silently report nothing"
    raw = [str(entry["id"]) for entry in yaml.safe_load(path.read_text())]
    assert len(raw) == len(set(raw)), f"{name}: an id appears twice (the loader would keep the last)"
    ids = {e.id for e in load_excerpts(FIELD)}
    valid = {c.value for c in Category}
    for excerpt_id, label in load_labels(path).items():
        assert excerpt_id in ids, f"{name}: {excerpt_id} is not a field excerpt"
        assert label.category is None or label.category in valid, f"{name}: {excerpt_id}"
        assert (label.category is None) == (label.node_at_fault is None), f"{name}: {excerpt_id}"


def test_every_disagreement_and_only_a_disagreement_is_adjudicated() -> None:
    second, adjudicated = load_labels(AGREEMENT / "second.yaml"), load_labels(AGREEMENT / "adjudicated.yaml")
    first = {e.id: e.category for e in load_excerpts(FIELD)}
    disagreements = {i for i, label in second.items() if label.category != first[i]}
    assert disagreements, "no disagreement at all would be a sign the second labeller saw the labels"
    assert set(adjudicated) == disagreements


def test_report_prints_the_figures_of_a_hand_computed_example(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # Four excerpts; kcover's verdict is the excerpt's text.  First labels: a, a, b, benign;
    # second: a, b, b, benign; adjudicated (the one disagreement, e2): a.
    excerpts = [Excerpt(f"e{i}", cat, None if cat is None else False, text)
                for i, (cat, text) in enumerate([("gpu_hardware", "gpu_hardware"), ("gpu_hardware", "gpu_hardware"),
                                                  ("user_code", "other"), (None, "")], 1)]

    class Verdict:
        def __init__(self, text: str) -> None:
            self.category = Category(text) if text else None

    monkeypatch.setattr(label_agreement, "explain", Verdict)
    second = {"e1": Label("gpu_hardware", False), "e2": Label("user_code", False),
              "e3": Label("user_code", False), "e4": Label(None, None)}
    report("holdout", excerpts, second, {"e2": Label("gpu_hardware", False)})
    out = capsys.readouterr().out
    assert "4 excerpts labelled twice" in out
    assert "labellers agree (category, benign as one) : 0.750" in out
    # kcover vs first over all four (benign counted): e1, e2 and e4 agree, e3 does not.
    assert "kcover agrees with the first labeller     : 0.750" in out
    assert "first labeller (corpus labels) : 0.667 (2/3)" in out
    assert "second labeller                : 0.333 (1/3)" in out
    assert "adjudicated where they differ  : 0.667 (2/3)" in out
    assert "both agree, fatal              : 0.500 (1/2)" in out
    assert "adjudicated 1: first labeller 1, second 0, neither 0" in out
