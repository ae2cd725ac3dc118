"""The ripgrep baseline of the scanning benchmark searches for what kcover searches for.

The translation to Rust regex is checked on its own (no ripgrep needed), and,
where ``rg`` is installed, every catalog example must match its rule's
translated patterns under the real ripgrep and no pattern may be refused, or
the throughput ratio would compare different work.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from bench.ripgrep import catalog_to_rust, to_rust, translate, usable

from kcover.classify.rules import Rule, load_catalog_files, shipped_catalog_files

RULES = [rule for rule in load_catalog_files(shipped_catalog_files()) if rule.spec.patterns]
RG = shutil.which("rg")


@pytest.mark.parametrize(
    ("python", "rust", "dropped"),
    [
        (r"(?<!\d)\d+ Killed\s+\S", r"\d+ Killed\s+\S", True),
        (r"instance of '(?!std::bad_alloc)", "instance of '", True),
        (r'exec: \"\S+\": not found in \$PATH', r'exec: "\S+": not found in \$PATH', False),
        (r"a{2,3}b{c}", r"a{2,3}b\{c\}", False),
        (r"[[\]&~x]", r"[\[\]\&\~x]", False),
        (r"end\Z \u00e9", r"end\z \x{00e9}", False),
        (r"failure on (?P<node>[\w.\-]{1,253})(?![\w.\-\[])", r"failure on (?:[\w.\-]{1,253})", True),
    ],
)
def test_python_patterns_are_spelled_the_rust_way(python: str, rust: str, dropped: bool) -> None:
    assert to_rust(python) == (rust, dropped)


@pytest.mark.skipif(RG is None, reason="ripgrep is not installed")
def test_ripgrep_compiles_every_catalog_pattern(tmp_path: Path) -> None:
    assert RG is not None
    translated = catalog_to_rust(RULES)
    kept, refused = usable(RG, translated.patterns, tmp_path)
    assert refused == 0 and kept == translated.patterns


@pytest.mark.skipif(RG is None, reason="ripgrep is not installed")
@pytest.mark.parametrize("rule", RULES, ids=lambda rule: rule.id)
def test_ripgrep_matches_every_example(rule: Rule, tmp_path: Path) -> None:
    assert RG is not None
    patterns = tmp_path / "patterns.rg"
    patterns.write_text("\n".join(translate(rule, p)[0] for p in rule.spec.patterns) + "\n")
    examples = tmp_path / "examples.log"
    examples.write_text("\n".join(rule.spec.examples) + "\n")
    done = subprocess.run([RG, "--no-config", "-c", "-f", str(patterns), str(examples)], capture_output=True,
                          text=True, check=False)
    assert done.stderr == ""
    assert done.stdout.strip() == (str(len(rule.spec.examples)) if rule.spec.examples else "")
