"""The field corpus (``tests/corpus/field``): real excerpts, well-formed, split by repository, never tuned on.

Accuracy on it is a measurement (``python -m bench.corpus_accuracy --corpus field``); these tests
keep the data honest: every excerpt has its thread, its repository and its reason, the halves are
disjoint by repository, and both halves are large enough to mean something.
"""

from __future__ import annotations

import yaml
from bench.corpus_accuracy import CORPUS, FIELD, field_split, load_excerpts, split_of

from kcover.faults import Category


def test_every_field_excerpt_names_its_thread_repository_and_reason() -> None:
    valid = {c.value for c in Category}
    for path in sorted(FIELD.glob("*.yaml")):
        for entry in yaml.safe_load(path.read_text()):
            where = f"{path.name}: {entry.get('id')}"
            assert str(entry["source"]).startswith("https://"), where
            assert entry["repo"] and entry["why"] and entry["text"].strip(), where
            assert entry["category"] is None or entry["category"] in valid, where
            assert (entry["category"] is None) == ("node_at_fault" not in entry), where


def test_ids_are_unique_across_both_corpora_and_no_thread_dominates() -> None:
    field, own = load_excerpts(FIELD), load_excerpts(CORPUS)
    ids = [e.id for e in field + own]
    assert len(ids) == len(set(ids))
    per_thread: dict[str, int] = {}
    for excerpt in field:
        per_thread[excerpt.source] = per_thread.get(excerpt.source, 0) + 1
    assert max(per_thread.values()) <= 3


def test_the_halves_are_disjoint_by_repository_and_large_enough() -> None:
    holdout, tune = field_split("holdout"), field_split("tune")
    assert {e.repo for e in holdout}.isdisjoint({e.repo for e in tune})
    for half in (holdout, tune):
        assert sum(e.category is not None for e in half) >= 120
        assert sum(e.category is None for e in half) >= 40
    assert sum(e.category is not None for e in holdout + tune) >= 300
    assert sum(e.category is None for e in holdout + tune) >= 100


def test_the_split_is_fixed_by_the_repository_name_alone() -> None:
    assert split_of("NVIDIA/nccl") == split_of(" nvidia/NCCL ")
    assert {split_of(f"owner/repo-{i}") for i in range(20)} == {"holdout", "tune"}
