"""User catalogs as hostile input: refused in one line with exit 2, or served per pattern; never a crash.

Runs the real ``kcover explain --catalog`` command: a pattern an engine cannot
compile falls back for that pattern only, a pattern that could backtrack or
match nothing is refused naming file, rule and field, and the file itself
(an alias bomb, ``/dev/zero``, a FIFO, a huge file) is read with bounds.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kcover.classify.engine import hyperscan_available
from kcover.classify.rules import MAX_CATALOG_BYTES

ENGINES = ["re", pytest.param("hyperscan", marks=pytest.mark.skipif(
    not hyperscan_available(), reason="hyperscan not installed"))]

RULE = """
rules:
  - id: my.rule
    title: mine
    category: gpu_hardware
    severity: fatal
    retriable: true
    node_at_fault: true
    role: root
    remediation: fix it
    patterns: [{pattern}]
    unless: [{unless}]
"""


def _catalog(tmp_path: Path, pattern: str, unless: str = "") -> Path:
    path = tmp_path / "bad.yaml"
    path.write_text(RULE.format(pattern=pattern, unless=unless), encoding="utf-8")
    return path


def _explain(catalog: Path | str, log_text: str, tmp_path: Path, engine: str = "auto",
             timeout: float = 120) -> subprocess.CompletedProcess[str]:
    log = tmp_path / "x.log"
    log.write_text(log_text, encoding="utf-8")
    command = [sys.executable, "-m", "kcover", "explain", "--json", "--engine", engine,
               "--catalog", str(catalog), str(log)]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)


@pytest.mark.parametrize(
    ("pattern", "line"),
    [
        (r"'caf\u00e9 (?:broke|melted)'", "café broke"),
        (r"'(?a)GPU\d+ melted'", "GPU42 melted"),
        (r"'\N{LATIN SMALL LETTER E WITH ACUTE}clair \d+'", "éclair 42"),
        ("\"(?x) gpu \\\\s+ melted  # a comment (with a paren\\n\"", "gpu   melted"),
        (r"'(?<=node )melted\b'", "node melted down"),
        (r"'(?i)[ÉE]CLAIR'", "éclair"),
    ],
    ids=["unicode-escape", "inline-ascii-flag", "named-escape", "verbose-comment", "look-behind",
         "non-ascii-class"],
)
@pytest.mark.parametrize("engine", ENGINES)
def test_a_pattern_an_engine_cannot_compile_falls_back_and_still_matches(
    tmp_path: Path, engine: str, pattern: str, line: str
) -> None:
    catalog = _catalog(tmp_path, pattern)
    found = _explain(catalog, f"boot ok\n{line}\nstep 2 ok\n", tmp_path, engine)
    assert found.returncode == 1, found.stderr
    assert '"rule": "my.rule"' in found.stdout
    clean = _explain(catalog, "boot ok\nstep 2 ok\n", tmp_path, engine)
    assert clean.returncode == 0, clean.stderr


@pytest.mark.parametrize(
    ("pattern", "unless", "field", "why"),
    [
        (r"'x{60000}'", "", "patterns", "above 1000"),
        (r"'\bx*\b'", "", "patterns", "empty string"),
        (r"'GPU melted'", r"'(a+)+$'", "unless", "nested repeat"),
        (r"'\d+ Killed'", "", "patterns", "search can start"),
        (r"'melted (\w+) \1'", "", "patterns", "back-references"),
        (r"'melted(?=.*boom)'", "", "patterns", "look-ahead"),
        (r"'GPU (?:\w+\s?)+ melted'", "", "patterns", "nested repeat"),
        (r"'GPU \d+\s*\d+ melted'", "", "patterns", "same characters"),
    ],
    ids=["huge-count", "empty-every-word", "exponential-unless", "quadratic-search", "backref",
         "lookahead-rescan", "nested-words", "adjacent"],
)
def test_a_dangerous_pattern_is_refused_in_one_line_naming_file_rule_and_field(
    tmp_path: Path, pattern: str, unless: str, field: str, why: str
) -> None:
    catalog = _catalog(tmp_path, pattern, unless)
    done = _explain(catalog, "GPU melted\n" + "a" * 5000 + "\n", tmp_path)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert str(catalog) in lines[0]
    assert "'my.rule'" in lines[0]
    assert f"field '{field}'" in lines[0]
    assert why in lines[0]


def _refused(done: subprocess.CompletedProcess[str], *words: str) -> None:
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    assert "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    for word in words:
        assert word in done.stderr


def test_a_yaml_alias_bomb_is_refused(tmp_path: Path) -> None:
    levels = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    levels += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)]
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join(levels) + "\nrules:\n  - id: *a9\n")
    _refused(_explain(bomb, "x\n", tmp_path, timeout=60), str(bomb), "aliases")


def test_a_key_given_twice_is_refused_naming_its_line(tmp_path: Path) -> None:
    # YAML keeps the last of two keys silently: the first patterns list would never be used
    catalog = tmp_path / "twice.yaml"
    catalog.write_text(RULE.format(pattern="'GPU melted'", unless="") + "    patterns: ['all fine']\n")
    _refused(_explain(catalog, "x\n", tmp_path), str(catalog), "line 13", "'patterns' is given twice")
    # the same keys in two mappings (two rules) are no repeat
    second = RULE.format(pattern="'GPU burnt'", unless="").replace("rules:\n", "").replace("my.rule", "my.other")
    catalog.write_text(RULE.format(pattern="'GPU melted'", unless="") + second)
    assert '"rule": "my.other"' in _explain(catalog, "GPU burnt\n", tmp_path).stdout


def test_dev_zero_as_a_catalog_is_refused(tmp_path: Path) -> None:
    _refused(_explain("/dev/zero", "x\n", tmp_path, timeout=60), "/dev/zero", "not a regular file")


def test_a_fifo_as_a_catalog_is_refused_without_waiting_for_a_writer(tmp_path: Path) -> None:
    fifo = tmp_path / "catalog.fifo"
    os.mkfifo(fifo)
    _refused(_explain(fifo, "x\n", tmp_path, timeout=60), str(fifo), "not a regular file")


def test_a_folder_as_a_catalog_is_refused(tmp_path: Path) -> None:
    _refused(_explain(tmp_path, "x\n", tmp_path, timeout=60), str(tmp_path), "not a regular file")


def test_an_oversized_catalog_is_refused_after_a_bounded_read(tmp_path: Path) -> None:
    huge = tmp_path / "huge.yaml"
    with huge.open("wb") as out:
        out.write(b"# " + b"x" * (MAX_CATALOG_BYTES + 10) + b"\nrules: []\n")
    _refused(_explain(huge, "x\n", tmp_path, timeout=60), str(huge), "larger than")


def test_a_catalog_that_is_not_utf8_is_refused(tmp_path: Path) -> None:
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(RULE.format(pattern="'caf\xe9'", unless="").encode("latin-1"))
    _refused(_explain(latin, "x\n", tmp_path, timeout=60), str(latin), "not UTF-8")


def test_a_deeply_nested_pattern_is_refused_not_a_crash(tmp_path: Path) -> None:
    catalog = _catalog(tmp_path, "'" + "(" * 3000 + "x" + ")" * 3000 + "'")
    _refused(_explain(catalog, "x\n", tmp_path, timeout=60), str(catalog), "'my.rule'", "'patterns'")
