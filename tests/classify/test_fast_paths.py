"""The fast paths of a scan give exactly what the plain ones gave.

Line breaks are unified without the slow two-byte ``bytes.replace`` when a
block allows it, and a catalog that passed its checks once is rebuilt from the
cache with its regexes compiled on first use.  Each must be invisible: the
same cleaned bytes, the same verdict and evidence, the same rules.
"""

from __future__ import annotations

import io
import os
import random
import re
from pathlib import Path

import pytest

from kcover import explain
from kcover.classify import engine as engine_module
from kcover.classify import rules as rules_module
from kcover.classify.engine import LiteralEngine, _without_redundant
from kcover.classify.matcher import Matcher, default_matcher
from kcover.classify.rules import LazyRegexes, load_catalog_files, parse_catalog, shipped_catalog_files
from kcover.collect import lines
from kcover.collect.lines import clean_block, read_blocks, unify_line_breaks

XID = b"NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus."
TRICKY = [
    b"",
    b"\r",
    b"\r\n",
    b"\n\r",
    b"\r\r\n\n\r",
    b"plain line\nanother\n",
    b"windows\r\nline ends\r\n",
    b" 10%|#    | 1/10\r 20%|##   | 2/10\r100%|#####| 10/10\n",
    b" 10%|#    | 1/10\r 20%|##   | 2/10\r\n" + XID + b"\r\n",
    b"progress 99%\r" + XID + b"\n",
    b"\x1b[31m" + XID + b"\x1b[0m\r\n",
    b"NV\x00RM: Xid\x00 (PCI:0000:3b:00): 79\r\nbad \xff\xfe utf-8\r\n",
    b"ends in a lone cr\r",
    b"ends in crlf\r\n",
    b"\x1b]0;title\x07\r\x1b[2K" + XID + b"\r",
]


def reference_clean(block: bytes) -> bytes:
    """Line breaks, colours and NULs cleaned the plain way, as kcover always did."""
    block = block.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    if b"\x1b" in block:
        block = lines._ANSI.sub(b"", block)
    return block.replace(b"\x00", b"")


def plain_unify(block: bytes) -> bytes:
    """Line breaks unified the plain way, with two ``bytes.replace``."""
    return block.replace(b"\r\n", b"\n").replace(b"\r", b"\n")


def random_blocks(count: int, seed: int = 3) -> list[bytes]:
    rng = random.Random(seed)
    alphabet = [b"a", b"Xid", b"\r", b"\n", b"\r\n", b"\x1b[1m", b"\x00", b"\xff", b" "]
    return [b"".join(rng.choice(alphabet) for _ in range(rng.randrange(40))) for _ in range(count)]


@pytest.mark.parametrize("block", TRICKY + random_blocks(400))
def test_clean_block_is_the_plain_cleaning(block: bytes) -> None:
    assert clean_block(block) == reference_clean(block)
    assert unify_line_breaks(block) == plain_unify(block)


@pytest.mark.parametrize("block_bytes", [1, 2, 3, 7, 64, 1 << 20])
def test_read_blocks_yields_the_blocks_of_the_plain_cleaning(block_bytes: int, monkeypatch: pytest.MonkeyPatch) -> None:
    data = b"".join(TRICKY + random_blocks(100, seed=5)) * 3
    fast = list(read_blocks(io.BytesIO(data), block_bytes=block_bytes))
    monkeypatch.setattr(lines, "unify_line_breaks", plain_unify)
    assert fast == list(read_blocks(io.BytesIO(data), block_bytes=block_bytes))


@pytest.mark.parametrize("text", [*TRICKY, b"".join(TRICKY), b"\r\n".join(TRICKY) * 50])
def test_verdict_and_evidence_are_those_of_the_plain_cleaning(
    text: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    matcher = Matcher(load_catalog_files(shipped_catalog_files()))
    fast = explain(text, matcher=matcher)
    monkeypatch.setattr(lines, "unify_line_breaks", plain_unify)
    plain = explain(text, matcher=Matcher(load_catalog_files(shipped_catalog_files())))
    assert fast == plain


@pytest.mark.parametrize("block", [clean_block(raw) for raw in [*TRICKY, b"".join(TRICKY) * 20, *random_blocks(50)]])
def test_scan_counted_counts_every_line_break_once(block: bytes) -> None:
    matcher = default_matcher()
    hits, breaks = matcher.scan_counted(block, 5)
    assert breaks == block.count(b"\n")
    assert hits == list(matcher.scan_block(block, 5))


def test_a_fault_after_a_carriage_return_overwrite_keeps_its_line_number() -> None:
    text = b"start\r\n 50%|##  |\r" + XID + b"\r\nmore\n"
    verdict = explain(text)
    assert verdict.root is not None
    assert verdict.root.evidence.line == XID.decode()
    assert verdict.root.evidence.line_number == 3


CATALOG = """
rules:
  - id: test.thing
    title: A thing
    category: user_code
    severity: fatal
    retriable: false
    node_at_fault: false
    role: root
    remediation: Fix the thing.
    ignore_case: true
    patterns: ['thing (?:went|is) wrong']
    unless: ['not really']
"""


def test_a_cached_catalog_gives_the_same_rules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    first = parse_catalog(CATALOG, "user.yaml")
    assert list((tmp_path / "kcover").glob("catalog-*.json"))
    checked = []
    monkeypatch.setattr(rules_module, "_check_regexes", lambda spec, source: checked.append(spec))
    second = parse_catalog(CATALOG, "elsewhere.yaml")
    assert not checked  # read back, not checked again
    assert [rule.spec for rule in second] == [rule.spec for rule in first]
    assert second[0].source == "elsewhere.yaml"
    assert second[0].matches("THING WENT WRONG") and not second[0].matches("thing went wrong, not really")


def test_a_damaged_cache_file_is_checked_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    first = parse_catalog(CATALOG, "user.yaml")
    for cached in (tmp_path / "kcover").glob("catalog-*.json"):
        cached.write_text('[{"id": "BAD ID"}]')
    assert [rule.spec for rule in parse_catalog(CATALOG, "user.yaml")] == [rule.spec for rule in first]


def test_a_refused_catalog_is_never_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    bad = CATALOG.replace("thing (?:went|is) wrong", "(a+)+b")
    for _ in range(2):
        with pytest.raises(rules_module.CatalogError, match=r"test\.thing"):
            parse_catalog(bad, "user.yaml")
    assert not list((tmp_path / "kcover").glob("catalog-*.json"))


def test_lazy_regexes_compile_on_first_use_and_compare_as_the_tuple() -> None:
    lazy = LazyRegexes(["a+b", "c"], re.IGNORECASE)
    assert lazy._compiled is None and len(lazy) == 2
    compiled = (re.compile("a+b", re.IGNORECASE), re.compile("c", re.IGNORECASE))
    assert lazy == compiled and hash(lazy) == hash(compiled)
    assert lazy == LazyRegexes(["a+b", "c"], re.IGNORECASE) != LazyRegexes(["a+b"], re.IGNORECASE)
    assert lazy[1].search("C") and [*lazy] == list(compiled) and lazy[:1] == compiled[:1]


def test_redundant_literals_are_dropped_without_losing_a_candidate(monkeypatch: pytest.MonkeyPatch) -> None:
    rules = [rule for rule in load_catalog_files(shipped_catalog_files()) if rule.spec.patterns]
    examples = "\n".join(example for rule in rules for example in rule.spec.examples)
    block = clean_block(b"".join(TRICKY) + examples.encode() + "\n进程已杀死\n已杀死\n".encode())
    pruned = LiteralEngine(rules)
    monkeypatch.setattr(engine_module, "_without_redundant", lambda literals: literals)
    every = LiteralEngine(rules)
    assert len(pruned._literals) < len(every._literals)
    assert set(pruned.candidates(block)) == set(every.candidates(block))


def test_a_literal_ending_with_another_of_the_same_rules_is_redundant() -> None:
    literals = {b"abc": {1}, b"xabc": {1}, b"yabc": {1, 2}, b"abcx": {1}, b"bc": {1}, b"c": {3}}
    assert _without_redundant(literals) == {b"yabc": {1, 2}, b"abcx": {1}, b"bc": {1}, b"c": {3}}


@pytest.mark.parametrize("block_bytes", [1, 2, 3, 7, 64])
def test_a_crlf_split_across_two_reads_is_one_line_break(block_bytes: int) -> None:
    text = b"step 1\r\nstep 2\r\nprogress 10%\rprogress 90%\r\nfatal: boom\r\n"
    whole = b"".join(read_blocks(io.BytesIO(text), 1 << 20))
    assert b"".join(read_blocks(io.BytesIO(text), block_bytes)) == whole  # before: an extra empty line
    assert whole.count(b"\n") == 5


def test_a_fifo_in_place_of_a_cache_file_is_ignored_not_waited_on(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    first = parse_catalog(CATALOG, "user.yaml")
    for cached in (tmp_path / "kcover").glob("catalog-*.json"):
        cached.unlink()
        os.mkfifo(cached)  # before: read_bytes() blocked for ever waiting for a writer
    assert [rule.spec for rule in parse_catalog(CATALOG, "user.yaml")] == [rule.spec for rule in first]
