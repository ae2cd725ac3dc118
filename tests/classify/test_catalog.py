"""Every shipped rule loads, its examples classify as that rule and its counter-examples do not.

Run against both engines, so a pattern that Hyperscan reads differently from
Python cannot slip through.  Bad catalogs are refused with file, rule and field named.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from kcover.classify.engine import hyperscan_available, pattern_entries
from kcover.classify.matcher import Matcher
from kcover.classify.rules import (
    CatalogError,
    Rule,
    load_catalog_files,
    parse_catalog,
    shipped_catalog_files,
)
from kcover.explain import explain

RULES = load_catalog_files(shipped_catalog_files())
ENGINES = ["re", pytest.param("hyperscan", marks=pytest.mark.skipif(
    not hyperscan_available(), reason="hyperscan not installed"))]


@pytest.fixture(scope="module", params=ENGINES)
def matcher(request: pytest.FixtureRequest) -> Matcher:
    return Matcher(RULES, engine=request.param)


def _winner(matcher: Matcher, line: str) -> str | None:
    hits = list(matcher.scan_block((line + "\n").encode(), 1))
    return hits[0].rule.id if hits else None


def test_catalog_has_every_category_and_enough_rules() -> None:
    from kcover.faults import Category

    assert len(RULES) >= 50
    assert {rule.spec.category for rule in RULES} == set(Category)


@pytest.mark.parametrize("rule", [r for r in RULES if r.spec.patterns], ids=lambda r: r.id)
def test_examples_classify_as_their_rule(matcher: Matcher, rule: Rule) -> None:
    assert rule.spec.examples, f"{rule.id} has no example line"
    for example in rule.spec.examples:
        assert _winner(matcher, example) == rule.id, example


@pytest.mark.parametrize("rule", [r for r in RULES if r.spec.counter_examples], ids=lambda r: r.id)
def test_counter_examples_do_not_match_their_rule(matcher: Matcher, rule: Rule) -> None:
    for line in rule.spec.counter_examples:
        assert _winner(matcher, line) != rule.id, line


def test_rule_ids_are_unique_across_files() -> None:
    ids = [rule.id for rule in RULES]
    assert len(ids) == len(set(ids))


GOOD = """
rules:
  - id: my.rule
    title: mine
    category: gpu_hardware
    severity: fatal
    retriable: true
    node_at_fault: true
    role: root
    remediation: fix it
    patterns: ['MY FAULT \\d+']
    examples: ['MY FAULT 1']
"""


def test_user_catalog_extends_the_shipped_one(tmp_path: Path) -> None:
    extra = tmp_path / "mine.yaml"
    extra.write_text(GOOD)
    rules = load_catalog_files([*shipped_catalog_files(), extra])
    verdict = explain("boot ok\nMY FAULT 7\n", matcher=Matcher(rules))
    assert verdict.rule == "my.rule"
    assert verdict.node_at_fault


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (("category: gpu_hardware", "category: gpu_melted"), "category"),
        (("MY FAULT \\d+", "MY FAULT (\\d+"), "patterns"),
        (("    remediation: fix it\n", ""), "remediation"),
        (("MY FAULT \\d+", "(?:x)?"), "patterns"),
        (("severity: fatal", "severity: terrible"), "severity"),
        (("retriable: true", "retriable: maybe"), "retriable"),
        (("    title: mine\n", "    title: mine\n    colour: red\n"), "colour"),
        (("    title: mine\n", "    title: mine\n    prefilter: ['(?:\\d+)+x']\n"), "prefilter"),
        (("    title: mine\n", "    title: mine\n    prefilter: ['FAULT (']\n"), "prefilter"),
        (("    patterns: ['MY FAULT \\d+']\n", "    prefilter: ['FAULT']\n    reasons: [Melted]\n"), "prefilter"),
    ],
    ids=["unknown-category", "bad-regex", "missing-field", "empty-match", "bad-severity",
         "bad-bool", "unknown-field", "backtracking-prefilter", "bad-prefilter", "prefilter-without-patterns"],
)
def test_invalid_rule_is_refused_naming_file_rule_and_field(change: tuple[str, str], field: str) -> None:
    text = GOOD.replace(*change)
    assert text != GOOD
    with pytest.raises(CatalogError) as caught:
        parse_catalog(text, "user.yaml")
    message = str(caught.value)
    assert "user.yaml" in message
    assert "'my.rule'" in message
    assert f"'{field}'" in message


def test_a_prefilter_changes_no_verdict_on_any_corpus() -> None:
    """A rule's prefilter is what the engine scans for instead of its patterns: it must let through every
    line the patterns match.  Every excerpt of both corpora gets the same verdict with and without them."""
    from bench.corpus_accuracy import CORPUS, FIELD, load_excerpts

    with_prefilters = [rule for rule in RULES if rule.spec.prefilter]
    assert with_prefilters, "no shipped rule has a prefilter: this test checks nothing"
    stripped = [dataclasses.replace(rule, spec=rule.spec.model_copy(update={"prefilter": []})) for rule in RULES]
    engine = "hyperscan" if hyperscan_available() else "re"
    fast, plain = Matcher(RULES, engine=engine), Matcher(stripped, engine=engine)
    excerpts = load_excerpts(CORPUS) + load_excerpts(FIELD)
    assert len(excerpts) > 800
    for excerpt in excerpts:
        got, want = explain(excerpt.text, matcher=fast), explain(excerpt.text, matcher=plain)
        assert (got.rule, got.category, got.node_at_fault) == (want.rule, want.category, want.node_at_fault), excerpt.id


def test_a_prefilter_is_scanned_for_instead_of_the_patterns() -> None:
    loose = parse_catalog(GOOD.replace("    title: mine\n", "    title: mine\n    prefilter: ['FAULT']\n"), "u.yaml")
    assert [entry.pattern for entry in pattern_entries(loose)] == ["FAULT"]
    assert [entry.pattern for entry in pattern_entries(parse_catalog(GOOD, "u.yaml"))] == ["MY FAULT \\d+"]
    assert explain("MY FAULT 3\n", matcher=Matcher(loose)).rule == "my.rule"
    assert explain("FAULT 3\n", matcher=Matcher(loose)).rule is None, "the patterns still decide"


def test_duplicate_id_is_refused(tmp_path: Path) -> None:
    first, second = tmp_path / "a.yaml", tmp_path / "b.yaml"
    first.write_text(GOOD)
    second.write_text(GOOD)
    with pytest.raises(CatalogError, match=r"b\.yaml: rule 'my\.rule': field 'id': duplicate id"):
        load_catalog_files([first, second])


def test_user_rule_cannot_reuse_a_shipped_id(tmp_path: Path) -> None:
    clash = tmp_path / "clash.yaml"
    clash.write_text(GOOD.replace("my.rule", RULES[0].id))
    with pytest.raises(CatalogError, match="duplicate id"):
        load_catalog_files([*shipped_catalog_files(), clash])


@pytest.mark.parametrize("text", ["rules: 3", "- a\n- b", "rules: [\n", "rules:\n  - 42"])
def test_malformed_file_is_refused(text: str) -> None:
    with pytest.raises(CatalogError, match=r"bad\.yaml"):
        parse_catalog(text, "bad.yaml")
