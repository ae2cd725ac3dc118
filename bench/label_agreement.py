"""How far two labellers agree on the field corpus, and where kcover stands between them.

The holdout figure of :mod:`bench.corpus_accuracy` is measured against one labeller's reading of
each excerpt.  Where a careful second reader would label differently, no classifier can be right
against both, so the agreement between two independent labellers bounds what the accuracy figure
can mean.  This bench compares:

- the corpus labels (the first labeller, ``tests/corpus/field/*.yaml``);
- a second labeller's labels (``agreement/second.yaml``), made blind: anonymous item numbers, the
  excerpts shuffled across both halves, no corpus label, no ``why`` and no verdict of kcover shown;
  the second labeller could read the source thread, as the first did;
- for the excerpts where the two differ, an adjudicator's label (``agreement/adjudicated.yaml``),
  also blind to kcover: it saw both labels and both reasons without knowing which labeller gave which.

It prints, per half: category agreement between the labellers (benign counted as a category) and
Cohen's kappa; then kcover's fatal-category accuracy against each label set, and on the excerpts
both labellers call fatal with the same category.  The corpus labels stay the headline: the
adjudicated figure is reported beside them, never instead of them.

Run:

    python -m bench.label_agreement
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml

from bench.corpus_accuracy import FIELD, SPLITS, Excerpt, field_split
from kcover.explain import explain

AGREEMENT = FIELD / "agreement"
BENIGN = "benign"


@dataclass(frozen=True)
class Label:
    category: str | None
    node_at_fault: bool | None


def load_labels(path: Path) -> dict[str, Label]:
    """Labels by excerpt id from an agreement file; empty when the file is absent."""
    if not path.is_file():
        return {}
    entries = yaml.safe_load(path.read_text()) or []
    return {str(e["id"]): Label(e.get("category"), e.get("node_at_fault")) for e in entries}


def cohen_kappa(pairs: list[tuple[str, str]]) -> float:
    """Cohen's kappa of two raters over nominal categories: (observed - chance) / (1 - chance)."""
    if not pairs:
        return float("nan")
    total = len(pairs)
    observed = sum(a == b for a, b in pairs) / total
    first, second = Counter(a for a, _ in pairs), Counter(b for _, b in pairs)
    chance = sum(first[c] * second[c] for c in first) / (total * total)
    return 1.0 if chance == 1 else (observed - chance) / (1 - chance)


def _name(category: str | None) -> str:
    return category or BENIGN


def fatal_accuracy(verdicts: Mapping[str, str | None], truth: Mapping[str, Label]) -> tuple[int, int]:
    """(right, fatal excerpts): kcover's category against ``truth`` on the excerpts ``truth`` calls fatal."""
    fatal = [i for i, label in truth.items() if label.category is not None and i in verdicts]
    return sum(verdicts[i] == truth[i].category for i in fatal), len(fatal)


def report(split: str, excerpts: list[Excerpt], second: dict[str, Label], adjudicated: dict[str, Label]) -> None:
    first = {e.id: Label(e.category, e.node_at_fault) for e in excerpts}
    both = [i for i in first if i in second]
    if not both:
        print(f"== {split} half: no second labels")
        return
    verdicts = {}
    for excerpt in excerpts:
        if excerpt.id in second:
            category = explain(excerpt.text).category
            verdicts[excerpt.id] = category.value if category else None
    pairs = [(_name(first[i].category), _name(second[i].category)) for i in both]
    agree = {i for i in both if first[i].category == second[i].category}
    settled = {i: adjudicated.get(i, first[i]) for i in both}  # only disagreements are adjudicated
    unsettled = sum(1 for i in both if i not in agree and i not in adjudicated)
    machine_pairs = [(_name(first[i].category), _name(verdicts[i])) for i in both]
    print(f"== {split} half: {len(both)} excerpts labelled twice")
    print(f"labellers agree (category, benign as one) : {len(agree) / len(both):.3f}  kappa {cohen_kappa(pairs):.3f}")
    print(f"kcover agrees with the first labeller     : "
          f"{sum(a == b for a, b in machine_pairs) / len(both):.3f}  kappa {cohen_kappa(machine_pairs):.3f}")
    for title, truth in (
        ("first labeller (corpus labels)", {i: first[i] for i in both}),
        ("second labeller", {i: second[i] for i in both}),
        ("adjudicated where they differ", settled),
        ("both agree, fatal", {i: first[i] for i in agree}),
    ):
        right, total = fatal_accuracy(verdicts, truth)
        print(f"kcover fatal accuracy vs {title:31}: {right / max(total, 1):.3f} ({right}/{total})")
    same_fatal = [i for i in agree if first[i].category is not None]
    node_same = sum(first[i].node_at_fault == second[i].node_at_fault for i in same_fatal)
    print(f"node_at_fault agrees where the category does: {node_same / max(len(same_fatal), 1):.3f} "
          f"({node_same}/{len(same_fatal)})")
    judged = [i for i in both if i not in agree and i in adjudicated]
    if judged:
        sides = Counter(
            "first" if adjudicated[i].category == first[i].category
            else "second" if adjudicated[i].category == second[i].category else "neither"
            for i in judged
        )
        print(f"adjudicated {len(judged)}: first labeller {sides['first']}, second {sides['second']}, "
              f"neither {sides['neither']}")
    if unsettled:
        print(f"({unsettled} disagreements not adjudicated yet: the corpus label stands for them)")


def main() -> None:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    second = load_labels(AGREEMENT / "second.yaml")
    adjudicated = load_labels(AGREEMENT / "adjudicated.yaml")
    for split in SPLITS:
        report(split, field_split(split), second, adjudicated)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
