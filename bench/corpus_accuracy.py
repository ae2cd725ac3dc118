"""Accuracy of the classifier on the labelled corpora: per-category precision/recall.

Prints, for every category, precision and recall of ``explain(text).category``
against the label, the false-alarm rate on benign excerpts, the recall of
``gpu_hardware``, the precision of ``node_at_fault`` and its recall (of the excerpts
labelled node-at-fault, how many the verdict blames); also the accuracy of
the multi-rank scenarios (category, action, blamed ranks).

Two corpora:

- ``tests/corpus/*.yaml`` (``--corpus own``): excerpts re-typed from public
  sources when the first rules were written; the rules were written from it.
- ``tests/corpus/field/*.yaml`` (``--corpus field``): real excerpts pasted by
  users in public issue threads, each with its link, labelled before any rule
  was written for it.  It is split by source repository into a *tune* half and
  a *holdout* half (:func:`split_of`: a hash of the repository name, fixed
  before labelling, so nobody chooses which excerpt lands where).  Rules may be
  written from tune misses only; holdout misses are never printed, so the
  holdout figure stays a measurement.  Both halves are reported, holdout first.

Run:

    python -m bench.corpus_accuracy [--corpus own|field] [--show-misses]
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import yaml

from kcover.explain import explain, explain_paths
from kcover.faults import Category

CORPUS = Path(__file__).resolve().parent.parent / "tests" / "corpus"
FIELD = CORPUS / "field"
SPLITS = ("holdout", "tune")


@dataclass(frozen=True)
class Excerpt:
    id: str
    category: str | None
    node_at_fault: bool | None
    text: str
    repo: str = ""
    source: str = ""


def load_excerpts(corpus: Path = CORPUS) -> list[Excerpt]:
    excerpts = []
    for path in sorted(corpus.glob("*.yaml")):
        for entry in yaml.safe_load(path.read_text()) or []:
            excerpts.append(
                Excerpt(
                    entry["id"], entry.get("category"), entry.get("node_at_fault"), entry["text"],
                    repo=str(entry.get("repo", "")), source=str(entry.get("source", "")),
                )
            )
    return excerpts


def split_of(repo: str) -> str:
    """``holdout`` or ``tune``: fixed by the source repository's name alone, so one thread never feeds both."""
    digest = hashlib.sha256(repo.strip().lower().encode()).digest()
    return SPLITS[digest[0] % 2]


def field_split(split: str, corpus: Path = FIELD) -> list[Excerpt]:
    """The field excerpts of one split (``holdout`` or ``tune``)."""
    return [e for e in load_excerpts(corpus) if split_of(e.repo) == split]


@dataclass
class Scores:
    fatal_accuracy: float
    false_alarm_rate: float
    gpu_hardware_recall: float
    node_precision: float
    node_recall: float
    per_category: dict[str, tuple[float, float, int]]
    misses: list[str]


def score(excerpts: list[Excerpt]) -> Scores:
    true_pos: Counter[str] = Counter()
    predicted: Counter[str] = Counter()
    actual: Counter[str] = Counter()
    fatal_right = fatal_total = benign_alarms = benign_total = 0
    node_said = node_right = node_labelled = node_found = 0
    misses = []
    for excerpt in excerpts:
        verdict = explain(excerpt.text)
        got = verdict.category.value if verdict.category else None
        if got:
            predicted[got] += 1
        if excerpt.category is None:
            benign_total += 1
            if got is not None:
                benign_alarms += 1
                misses.append(f"{excerpt.id}: benign, got {got} ({verdict.rule})")
            continue
        actual[excerpt.category] += 1
        fatal_total += 1
        if got == excerpt.category:
            fatal_right += 1
            true_pos[got] += 1
        else:
            misses.append(f"{excerpt.id}: want {excerpt.category}, got {got} ({verdict.rule})")
        if excerpt.node_at_fault is True:
            node_labelled += 1
            node_found += bool(verdict.node_at_fault)
        if verdict.node_at_fault:
            node_said += 1
            node_right += excerpt.node_at_fault is True
            if excerpt.node_at_fault is not True:
                misses.append(f"{excerpt.id}: node_at_fault said, label {excerpt.node_at_fault}")
    per_category = {}
    for category in Category:
        name = category.value
        precision = true_pos[name] / predicted[name] if predicted[name] else float("nan")
        recall = true_pos[name] / actual[name] if actual[name] else float("nan")
        per_category[name] = (precision, recall, actual[name])
    gpu = per_category["gpu_hardware"][1]
    return Scores(
        fatal_accuracy=fatal_right / max(fatal_total, 1),
        false_alarm_rate=benign_alarms / max(benign_total, 1),
        gpu_hardware_recall=gpu,
        node_precision=node_right / node_said if node_said else 1.0,
        node_recall=node_found / node_labelled if node_labelled else float("nan"),
        per_category=per_category,
        misses=misses,
    )


def score_scenarios(corpus: Path = CORPUS / "multirank") -> tuple[int, int, list[str]]:
    right = 0
    problems = []
    folders = sorted(p for p in corpus.iterdir() if p.is_dir()) if corpus.is_dir() else []
    for folder in folders:
        label = yaml.safe_load((folder / "scenario.yaml").read_text())
        logs = [p for p in sorted(folder.iterdir()) if p.name != "scenario.yaml"]
        verdict = explain_paths(logs)
        got = (verdict.category.value if verdict.category else None, verdict.action.value)
        want = (label.get("category"), label.get("action"))
        ranks_ok = sorted(label.get("blamed_ranks") or []) == sorted(verdict.ranks) or not label.get(
            "blamed_ranks"
        )
        if got == want and ranks_ok:
            right += 1
        else:
            problems.append(f"{folder.name}: want {want} ranks {label.get('blamed_ranks')}, "
                            f"got {got} ranks {list(verdict.ranks)} ({verdict.rule})")
    return right, len(folders), problems


def print_scores(title: str, excerpts: list[Excerpt], scores: Scores) -> None:
    fatal = sum(e.category is not None for e in excerpts)
    repos = len({e.repo for e in excerpts if e.repo})
    print(f"== {title}: {len(excerpts)} excerpts ({fatal} fatal, {len(excerpts) - fatal} benign"
          + (f", {repos} repositories)" if repos else ")"))
    print(f"{'category':26} {'precision':>9} {'recall':>7} {'n':>4}")
    for name, (precision, recall, count) in scores.per_category.items():
        print(f"{name:26} {precision:9.2f} {recall:7.2f} {count:4d}")
    print(f"fatal category accuracy : {scores.fatal_accuracy:.3f}")
    print(f"benign false-alarm rate : {scores.false_alarm_rate:.3f}")
    print(f"gpu_hardware recall     : {scores.gpu_hardware_recall:.3f}")
    print(f"node_at_fault precision : {scores.node_precision:.3f}")
    print(f"node_at_fault recall    : {scores.node_recall:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--corpus", choices=("own", "field"), default="own")
    parser.add_argument("--show-misses", action="store_true", help="tune and own corpora only, never holdout")
    args = parser.parse_args()
    if args.corpus == "field":
        for split in SPLITS:
            excerpts = field_split(split)
            scores = score(excerpts)
            print_scores(f"field corpus, {split} half", excerpts, scores)
            if args.show_misses and split == "tune":
                for line in scores.misses:
                    print("  miss:", line)
        sys.stdout.flush()
        return
    excerpts = load_excerpts()
    scores = score(excerpts)
    print_scores("own corpus", excerpts, scores)
    right, total, problems = score_scenarios()
    print(f"multi-rank scenarios    : {right}/{total}")
    if args.show_misses:
        for line in scores.misses + problems:
            print("  miss:", line)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
