"""The ripgrep baseline of the scanning benchmark: catalog patterns in Rust regex syntax, and ``rg`` itself.

ripgrep (``rg -j1 -c -f``) is the fastest common tool a user would reach for
instead of kcover, so ``kcover explain`` is measured against it on the same
file, searching the same catalog patterns.  Rust's regex has no look-around
and no back-references: look-around groups are dropped (rg then searches a
superset, more work than kcover's, never less) and a pattern rg still refuses
is left out; both are counted so the report says what was compared.

Other differences are spelled the Rust way: case-insensitive rules become
``(?i:…)``, ``\\Z`` becomes ``\\z``, ``\\uXXXX`` becomes ``\\x{XXXX}``, escaped
punctuation that Rust does not treat as special (``\\'``, ``\\"``, ``\\/``)
becomes the bare character, a named group (``(?P<node>``) becomes ``(?:`` (rg joins the
patterns into one regex, where a name may appear once), and ``[``, ``&``, ``~`` inside a class and a brace
that is not a repetition are escaped.

:func:`find_ripgrep` finds ``rg`` or, when running as root with ``apt-get``,
installs Debian's ``ripgrep`` package; otherwise the benchmark skips ripgrep
with a message.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from bench.ere import NAMED_GROUP, skip_group
from kcover.classify.rules import Rule

_LOOKAROUND = ("(?!", "(?<!", "(?<=", "(?=")
_RUST_META = set("\\.+*?()|[]{}^$#&-~")
_REPETITION = re.compile(r"\{\d*(?:,\d*)?\}")
_UNICODE_ESCAPE = re.compile(r"u([0-9a-fA-F]{4})|U([0-9a-fA-F]{8})")
INSTALL_SECONDS = 300


@dataclass(frozen=True)
class Translated:
    """Catalog patterns in Rust syntax, and how many lost a look-around group on the way (superset)."""

    patterns: list[str]
    lookaround_dropped: int


def _escape(pattern: str, index: int, in_class: bool) -> tuple[str, int]:
    """One backslash escape in Rust spelling, and the index past it."""
    nxt = pattern[index + 1]
    unicode = _UNICODE_ESCAPE.match(pattern, index + 1)
    if unicode:
        return f"\\x{{{unicode.group(1) or unicode.group(2)}}}", unicode.end()
    if nxt == "Z" and not in_class:
        return "\\z", index + 2
    if nxt.isascii() and not nxt.isalnum() and nxt not in _RUST_META and not nxt.isspace():
        return nxt, index + 2  # Python tolerates \' \" \/ \: ...; Rust only escapes its meta characters
    return pattern[index : index + 2], index + 2


def to_rust(pattern: str) -> tuple[str, bool]:
    """``pattern`` (Python ``re``) in Rust regex syntax, and whether a look-around group was dropped."""
    out: list[str] = []
    dropped = False
    index = 0
    in_class = False
    while index < len(pattern):
        char = pattern[index]
        if char == "\\" and index + 1 < len(pattern):
            text, index = _escape(pattern, index, in_class)
            out.append(text)
            continue
        if in_class:
            closes = char == "]" and out[-1] not in ("[", "[^")
            in_class = not closes
            out.append(f"\\{char}" if char in "[&~" else char)
            index += 1
            continue
        if pattern.startswith(_LOOKAROUND, index):
            index = skip_group(pattern, index)
            dropped = True
            continue
        named = NAMED_GROUP.match(pattern, index)
        if named:  # rg joins every pattern into one regex, where a group name may appear only once
            out.append("(?:")
            index = named.end()
            continue
        if char == "[":
            in_class = True
            negated = pattern.startswith("[^", index)
            out.append("[^" if negated else "[")
            index += 2 if negated else 1
            continue
        repetition = _REPETITION.match(pattern, index) if char == "{" else None
        if repetition:
            out.append(repetition.group())
            index = repetition.end()
            continue
        out.append(f"\\{char}" if char in "{}" else char)  # a brace that is no repetition is a literal
        index += 1
    return "".join(out), dropped


def translate(rule: Rule, pattern: str) -> tuple[str, bool]:
    """One catalog pattern of ``rule`` for rg, case-insensitivity included."""
    rust, dropped = to_rust(pattern)
    return (f"(?i:{rust})" if rule.spec.ignore_case else rust), dropped


def catalog_to_rust(rules: list[Rule]) -> Translated:
    """Every line pattern of the catalog in Rust syntax."""
    patterns: list[str] = []
    dropped = 0
    for rule in rules:
        for pattern in rule.spec.patterns:
            rust, lost = translate(rule, pattern)
            patterns.append(rust)
            dropped += lost
    return Translated(patterns, dropped)


# rg's default limit on a compiled regex (100 MB) is near what the whole catalog needs (Rust's \\w and \\d are
# Unicode classes): raised, as a user searching this many patterns would; the lazy DFA's cache stays as it was
SIZE_LIMIT = ["--regex-size-limit", "1G"]


def _accepts(rg: str, patterns: list[str], folder: Path) -> bool:
    """Whether rg compiles all these patterns (searching a one-line file: an empty one is never compiled for)."""
    listing = folder / "probe.rg"
    listing.write_text("\n".join(patterns) + "\n")
    sample = folder / "sample.log"
    sample.write_bytes(b"a line\n")
    done = subprocess.run([rg, "--no-config", *SIZE_LIMIT, "-c", "-f", str(listing), str(sample)],
                          capture_output=True, check=False)
    return done.returncode in (0, 1)


def usable(rg: str, patterns: list[str], folder: Path) -> tuple[list[str], int]:
    """The patterns rg compiles, and how many it refused (each tried alone only when the whole set fails)."""
    if _accepts(rg, patterns, folder):
        return patterns, 0
    kept = [pattern for pattern in patterns if _accepts(rg, [pattern], folder)]
    return kept, len(patterns) - len(kept)


def find_ripgrep(install: bool = True) -> tuple[str | None, str]:
    """The ``rg`` to run, or ``None`` and why not; installs Debian's package when root and allowed."""
    found = shutil.which("rg")
    if found:
        return found, ""
    if not install:
        return None, "ripgrep skipped: rg is not installed (and --no-install was given)"
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return None, "ripgrep skipped: rg is not installed, and apt-get as root is not available to install it"
    try:
        done = subprocess.run(["apt-get", "install", "-y", "-q", "ripgrep"], capture_output=True, text=True,
                              timeout=INSTALL_SECONDS, check=False,
                              env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    except (OSError, subprocess.TimeoutExpired) as error:
        return None, f"ripgrep skipped: apt-get install ripgrep failed ({error})"
    found = shutil.which("rg")
    if done.returncode != 0 or not found:
        last = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        return None, f"ripgrep skipped: apt-get install ripgrep failed ({last[0]})"
    return found, "ripgrep installed from Debian's packages"
