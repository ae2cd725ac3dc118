"""Required literals: the prefilter of the pure-Python engine, and of patterns Hyperscan does not take.

A pattern with non-ASCII text (a localized message) goes to the literal engine
even when Hyperscan is installed; without a literal it is searched by a Python
regex over every block, ten times slower than the rest of the scan.  Caseless
characters (CJK) make literals, letters with case outside ASCII do not.
"""

from __future__ import annotations

import pytest

from kcover.classify.engine import make_engine
from kcover.classify.literals import required_literals
from kcover.classify.rules import parse_catalog

CATALOG = """
rules:
  - id: test.killed-zh
    title: Killed, in Chinese
    category: host_system
    severity: fatal
    retriable: true
    node_at_fault: false
    role: root
    ignore_case: true
    patterns: ['已杀死$']
    remediation: none
"""


@pytest.mark.parametrize(
    ("pattern", "literals"),
    [
        ("已杀死$", ["已杀死"]),
        (r"(?<!\d)\d+ 已杀死\s", [" 已杀死"]),
        ("Killed$", ["killed"]),
        ("café au lait", [" au lait"]),  # é has a case: bytes.lower cannot fold it, so it is no literal
        ("É", None),
    ],
)
def test_caseless_characters_make_literals(pattern: str, literals: list[str] | None) -> None:
    assert required_literals(pattern) == literals


@pytest.mark.parametrize("engine", ["re", "hyperscan"])
def test_a_localized_pattern_is_found_by_its_literal(engine: str) -> None:
    if engine == "hyperscan":
        pytest.importorskip("hyperscan")
    rules = parse_catalog(CATALOG, "test.yaml")
    found = make_engine(rules, engine)
    block = "step 1 loss 2.0\n已杀死\nstep 2\n".encode()
    assert [offset for offset, _ in found.candidates(block)] == [block.index("已杀死".encode()) + 9]
