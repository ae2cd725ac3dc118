"""Diagnosis of wording no rule knows: the generic verdicts with and without the layer vocabulary.

The held-out figure of :mod:`bench.corpus_accuracy` is limited by the
sentences the catalog has never seen.  This benchmark simulates that on every
excerpt: it removes every rule that names a layer, so that only the generic
ones remain (``python.exception``, the exit-status rules and the fallback's
"failure no rule recognises"), and measures the fatal-category accuracy of
what is left, twice in the same run:

- *baseline*: the generic verdicts as they were before the vocabulary: an
  exception line is ``user_code``, an unrecognised failure ``other``;
- *vocabulary*: the category the evidence's words name
  (:mod:`kcover.classify.vocabulary`), where they name one.

The baseline is the same verdict with its generic category put back.  One
kind of verdict exists only through the vocabulary: a log whose last line
says something failed in a layer's words (:mod:`kcover.classify.fallback`);
the baseline counts it as ``other``, so the baseline is not "kcover without
the vocabulary", only "the same verdicts without its categories".  The
benchmark also prints how many benign excerpts get any verdict (a false
alarm from that last-line rule shows there).  Both field halves are
reported, holdout first; no excerpt is ever printed.

Run:

    python -m bench.unknown_wording
"""

from __future__ import annotations

import argparse
import sys

from bench.corpus_accuracy import SPLITS, Excerpt, field_split, load_excerpts
from kcover.classify.exit_codes import FALLBACK_RULE
from kcover.classify.matcher import Matcher, default_matcher
from kcover.explain import explain
from kcover.faults import GENERIC_EXCEPTION_RULE, UNRECOGNISED_FAILURE_RULE, Category

GENERIC_CATEGORY = {UNRECOGNISED_FAILURE_RULE: Category.OTHER, GENERIC_EXCEPTION_RULE: Category.USER_CODE}
"""The category each generic verdict had before the vocabulary."""


def generic_matcher() -> Matcher:
    """The shipped catalog without any rule that names a layer: the exception rule and the exit-status rules."""
    rules = default_matcher().rules
    return Matcher([rule for rule in rules if rule.id in GENERIC_CATEGORY or rule.spec.exit_codes
                    or rule.id == FALLBACK_RULE])


def score(excerpts: list[Excerpt], matcher: Matcher) -> tuple[int, int, int, int, int]:
    """Fatal excerpts, right with the vocabulary, right on the baseline, benign excerpts, benign given a verdict."""
    fatal = vocabulary_right = baseline_right = benign = alarms = 0
    for excerpt in excerpts:
        verdict = explain(excerpt.text, matcher=matcher)
        category = verdict.category
        if excerpt.category is None:
            benign += 1
            alarms += category is not None
            continue
        baseline = GENERIC_CATEGORY.get(verdict.rule or "", category)
        fatal += 1
        vocabulary_right += category is not None and category.value == excerpt.category
        baseline_right += baseline is not None and baseline.value == excerpt.category
    return fatal, vocabulary_right, baseline_right, benign, alarms


def report(title: str, excerpts: list[Excerpt], matcher: Matcher) -> None:
    fatal, vocabulary_right, baseline_right, benign, alarms = score(excerpts, matcher)
    ratio = vocabulary_right / baseline_right if baseline_right else float("inf")
    print(f"== {title}: {fatal} fatal, {benign} benign excerpts, layer-naming rules removed")
    print(f"fatal accuracy, generic verdicts     : {baseline_right / max(fatal, 1):.3f}")
    print(f"fatal accuracy, with the vocabulary  : {vocabulary_right / max(fatal, 1):.3f} ({ratio:.2f}x)")
    print(f"benign excerpts given a verdict      : {alarms}/{benign}")


def main() -> None:
    argparse.ArgumentParser(description=__doc__).parse_args()
    matcher = generic_matcher()
    for split in SPLITS:
        report(f"field corpus, {split} half", field_split(split), matcher)
    report("own corpus", load_excerpts(), matcher)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
