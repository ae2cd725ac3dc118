"""Regular expressions against hostile lines: no shipped or user pattern may take super-linear time.

Every shipped pattern and ``unless`` pattern must pass the linear-time check
(:mod:`kcover.classify.lint`), and must get through 1 MiB lines built to hurt
it (long runs of digits, spaces, word characters, repeats of its own words)
within a generous timeout.  The matcher must also bound the time of a pattern
that slipped past the check: it confirms long lines on windows, never whole.
"""

from __future__ import annotations

import multiprocessing
import os
import re
import re._constants as sre
import re._parser as sre_parse
import subprocess
import sys
import time
from functools import cache

import pytest

from kcover.classify.engine import hyperscan_available
from kcover.classify.lint import regex_problem
from kcover.classify.matcher import DecisionCache, Matcher
from kcover.classify.rules import Rule, RuleSpec, load_catalog_files, shipped_catalog_files

RULES = load_catalog_files(shipped_catalog_files())
MIB = 1 << 20
GENERIC_FRAGMENTS = ["1", " ", "a", "1 ", "a.", ":", "x("]
ENGINES = ["re", pytest.param("hyperscan", marks=pytest.mark.skipif(
    not hyperscan_available(), reason="hyperscan not installed"))]


def _patterns(rule: Rule) -> list[re.Pattern[str]]:
    return [*rule.regexes, *rule.unless]


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.id)
def test_every_shipped_pattern_passes_the_linear_time_check(rule: Rule) -> None:
    for pattern in [*rule.spec.patterns, *rule.spec.unless]:
        assert regex_problem(pattern, rule.spec.ignore_case) is None, pattern


def _literal_runs(pattern: str) -> list[str]:
    """Runs of plain characters in a pattern (its own words), longest first."""
    runs: list[str] = []
    current: list[str] = []
    for op, av in _flatten(list(sre_parse.parse(pattern))):
        if op is sre.LITERAL:
            current.append(chr(av))
            continue
        runs.append("".join(current))
        current = []
    runs.append("".join(current))
    return sorted({run for run in runs if run}, key=len, reverse=True)[:4]


def _flatten(items: list[tuple[object, object]]) -> list[tuple[object, object]]:
    flat: list[tuple[object, object]] = []
    for op, av in items:
        if op is sre.SUBPATTERN:
            flat.extend(_flatten(list(av[-1])))  # type: ignore[index]
        elif op is sre.BRANCH:
            for branch in av[1]:  # type: ignore[index]
                flat.extend(_flatten(list(branch)))
                flat.append((None, None))
        else:
            flat.append((op, av))
    return flat


def _line(fragment: str) -> str:
    return (fragment * (MIB // len(fragment) + 1))[:MIB]


@cache
def _generic_line(fragment: str) -> str:
    return _line(fragment)


def _hostile_lines(pattern: str) -> list[str]:
    """1 MiB lines: runs of digits, spaces, word characters, and repeats of the pattern's words."""
    lines = [_generic_line(fragment) for fragment in GENERIC_FRAGMENTS]
    for run in _literal_runs(pattern)[:3]:
        lines += [_line(run), _line("1 " + run + " ")]
    return lines


HOSTILE_SECONDS = 300
"""All patterns together get through their hostile lines in this time (about 170 s of one core
today); a super-linear pattern takes hours on one of them."""


def _search_hostile_lines(pattern: str, flags: int) -> float:
    """Seconds one pattern takes over all its hostile lines (run in a worker process)."""
    regex = re.compile(pattern, flags)
    start = time.perf_counter()
    for line in _hostile_lines(pattern):
        regex.search(line)
    return time.perf_counter() - start


@cache
def _hostile_seconds() -> dict[tuple[str, int], float]:
    """Every shipped pattern over its hostile lines, on every core at once, measured once for all
    the tests; a pattern still searching at the deadline counts as infinite (its worker is killed
    with the pool), so each rule's test fails by name without searching again."""
    jobs = sorted({(regex.pattern, regex.flags) for rule in RULES for regex in _patterns(rule)})
    deadline = time.monotonic() + HOSTILE_SECONDS
    seconds = {}
    with multiprocessing.get_context("fork").Pool(os.cpu_count() or 1) as pool:
        pending = {job: pool.apply_async(_search_hostile_lines, job) for job in jobs}
        for job, result in pending.items():
            try:
                seconds[job] = result.get(timeout=max(0.0, deadline - time.monotonic()))
            except multiprocessing.TimeoutError:
                seconds[job] = float("inf")
    return seconds


@pytest.mark.timeout(600, method="thread")
@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.id)
def test_every_shipped_rule_gets_through_1mib_hostile_lines(rule: Rule) -> None:
    seconds = _hostile_seconds()
    for regex in _patterns(rule):
        took = seconds[(regex.pattern, regex.flags)]
        assert took < HOSTILE_SECONDS, f"{regex.pattern!r} still searching its 1 MiB hostile lines after {took} s"


def _unchecked_rule(pattern: str) -> Rule:
    """A rule built without the catalog checks, as if a bad pattern had slipped through."""
    spec = RuleSpec(
        id="slipped.through", title="t", category="host_system", severity="fatal", retriable=True,
        node_at_fault=False, role="root", remediation="r", patterns=[pattern],
    )
    return Rule(spec=spec, source="test", regexes=(re.compile(pattern),), unless=())


@pytest.mark.timeout(120, method="thread")
@pytest.mark.parametrize("engine", ENGINES)
def test_a_quadratic_pattern_cannot_stall_the_matcher_on_a_1mib_line(engine: str) -> None:
    matcher = Matcher([_unchecked_rule(r"\d+ Killed\s+\S")], engine=engine)
    hostile = b"1" * (MIB - 40) + b" Killed\n"
    assert list(matcher.scan_block(hostile, 1)) == []
    real = b"1" * (MIB - 40) + b" Killed python\n"
    hits = list(matcher.scan_block(real, 1))
    assert [hit.rule.id for hit in hits] == ["slipped.through"]


@pytest.mark.parametrize("engine", ENGINES)
def test_a_fault_deep_in_a_long_line_is_found_with_its_prefix_facts(engine: str) -> None:
    matcher = Matcher(RULES, engine=engine)
    line = b"2024-05-01T10:00:00Z stderr F [rank3]: " + b"q" * 500_000 + b" CUDA out of memory. " + b"w" * 9000
    hits = list(matcher.scan_block(line + b"\n", 7))
    assert [hit.rule.id for hit in hits] == ["cuda.oom"]
    assert hits[0].line_number == 7
    assert hits[0].line.rank == 3
    assert hits[0].line.timestamp == "2024-05-01T10:00:00Z"
    assert "CUDA out of memory" in hits[0].line.text
    assert len(hits[0].line.text) < 10_000


@pytest.mark.parametrize("engine", ENGINES)
def test_an_anchored_rule_does_not_match_in_the_middle_of_a_long_line(engine: str) -> None:
    matcher = Matcher(RULES, engine=engine)
    for cut in range(0, 6000, 997):
        line = b"k" * (20_000 + cut) + b" ModuleNotFoundError: No module named 'x' " + b"z" * 20_000
        winners = [hit.rule.id for hit in matcher.scan_block(line + b"\n", 1)]
        assert "python.import-error" not in winners, cut


def test_the_decision_cache_is_bounded_in_bytes() -> None:
    cache = DecisionCache(max_entries=10_000, max_bytes=1 << 20)
    for index in range(2_000):
        cache.put((f"{index} " + "z" * 4000, frozenset({1})), None)
    assert cache.bytes <= 1 << 20
    assert 0 < len(cache) < 2_000
    assert cache.get((f"{1_999} " + "z" * 4000, frozenset({1}))) == (True, None)
    assert cache.get((f"{0} " + "z" * 4000, frozenset({1}))) == (False, None)


MEMORY_CHILD = """
import resource, subprocess, sys
child = subprocess.Popen([sys.executable, "-m", "kcover", "explain", "--json"],
                         stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
for index in range(int(sys.argv[1])):
    child.stdin.write(b"%d " % index + b"z" * 900_000 + b" CUDA out of memory %d\\n" % index)
child.stdin.close()
child.wait()
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
"""


@pytest.mark.timeout(600)
def test_distinct_900kb_lines_do_not_fill_memory() -> None:
    done = subprocess.run([sys.executable, "-c", MEMORY_CHILD, "250"], capture_output=True, text=True,
                          timeout=580, check=True)
    peak_mb = int(done.stdout) / 1024
    assert peak_mb <= 150, f"peak RSS {peak_mb:.0f} MB on 250 distinct 900 KB lines"
