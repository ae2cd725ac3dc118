"""The grep baseline of the scanning benchmark searches for what kcover searches for.

Every catalog example must match its rule's patterns translated to ERE, under
the real GNU grep, or the throughput ratio would compare different work.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from bench.ere import to_ere

from kcover.classify.rules import Rule, load_catalog_files, shipped_catalog_files

RULES = [rule for rule in load_catalog_files(shipped_catalog_files()) if rule.spec.patterns]


@pytest.mark.skipif(shutil.which("grep") is None, reason="no grep on this machine")
@pytest.mark.parametrize("rule", RULES, ids=lambda rule: rule.id)
def test_grep_matches_every_example(rule: Rule, tmp_path: Path) -> None:
    patterns = tmp_path / "patterns.ere"
    patterns.write_text("\n".join(to_ere(p, rule.spec.ignore_case) for p in rule.spec.patterns) + "\n")
    examples = "\n".join(rule.spec.examples) + "\n"
    done = subprocess.run(["grep", "-E", "-c", "-f", str(patterns)], input=examples, capture_output=True,
                          text=True, check=False)
    assert done.stderr == ""
    assert done.stdout.strip() == str(len(rule.spec.examples))


ESCAPE_CASES = [
    (r'^err: "[^"\n]+"$', ['err: "n"', 'err: "a\\b"', 'err: ""', 'err: "x"y"']),
    (r"^a[ \t]{1,2}b$", ["a\tb", "a b", "atb", "a\\b"]),
    (r"^x\ty$", ["x\ty", "xty", "x y"]),
    (r"^[\n\d]+$", ["123", "n12", ""]),
    (r"^[a^\n]+$", ["a^a", "^", "n", "a\\"]),
]


@pytest.mark.skipif(shutil.which("grep") is None, reason="no grep on this machine")
@pytest.mark.parametrize(("pattern", "lines"), ESCAPE_CASES, ids=[case[0] for case in ESCAPE_CASES])
def test_control_escapes_mean_the_same_to_grep(pattern: str, lines: list[str], tmp_path: Path) -> None:
    """``\\n`` in a bracket, ``\\t`` anywhere: grep selects exactly the lines Python's ``re`` matches."""
    patterns = tmp_path / "patterns.ere"
    patterns.write_text(to_ere(pattern, ignore_case=False) + "\n")
    done = subprocess.run(["grep", "-E", "-f", str(patterns)], input="\n".join(lines) + "\n",
                          capture_output=True, text=True, check=False)
    assert done.stderr == ""
    assert done.stdout.splitlines() == [line for line in lines if re.search(pattern, line)]


def test_a_bracket_of_only_a_newline_is_refused() -> None:
    with pytest.raises(ValueError, match="only"):
        to_ere(r"a[^\n]b", ignore_case=False)
