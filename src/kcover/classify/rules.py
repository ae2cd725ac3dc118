"""Fault rules as data: the schema of a catalog file and its loader.

The catalog is YAML shipped with the package (``kcover/classify/catalog/*.yaml``)
plus any files the user adds.  Each file holds ``rules:`` (a list) and optional
``defaults:`` merged under every rule of that file.  A rule names its patterns
(Python regular expressions, also compiled by Hyperscan in prefilter mode), what
the fault means (category, severity, retriable, node at fault, root or cascade
role), a remediation text, and example and counter-example lines that the test
suite checks.

A bad catalog is refused whole with :class:`CatalogError`, whose one-line
message names the file, the rule id and the field, so a broken rule never
reaches a running job.  Catalogs are input like any other: a file is read only
when it is a regular file of at most :data:`MAX_CATALOG_BYTES`, YAML aliases
(the "billion laughs" expansion) are refused, and every pattern must pass the
linear-time check of :mod:`kcover.classify.lint` (no pattern that can match the
empty string or backtrack without bound).  Called by
:mod:`kcover.classify.matcher` and by the ``--catalog`` option.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from kcover.classify.lint import regex_problem
from kcover.faults import Action, Category, Role, Severity

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
MAX_CATALOG_BYTES = 4 << 20
"""Largest catalog file read (the shipped files are about 20 KB each)."""


class CatalogError(ValueError):
    """A catalog file cannot be used; the message names the file, rule and field."""


class RuleSpec(BaseModel):
    """One rule as written in YAML (validated, then frozen into :class:`Rule`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(pattern=r"^[a-z0-9][a-z0-9_.\-]*$")
    title: str = Field(min_length=1)
    category: Category
    severity: Severity
    retriable: bool
    node_at_fault: bool
    role: Role
    remediation: str = Field(min_length=1)
    patterns: list[str] = Field(default_factory=list)
    ignore_case: bool = False
    unless: list[str] = Field(default_factory=list)
    priority: int = Field(default=50, ge=0, le=100)
    action: Action | None = None
    exit_codes: list[int] = Field(default_factory=list)
    reasons: list[str] = Field(default_factory=list)
    examples: list[str] = Field(default_factory=list)
    counter_examples: list[str] = Field(default_factory=list)

    @field_validator("patterns", "unless")
    @classmethod
    def _regexes_compile(cls, value: list[str]) -> list[str]:
        for pattern in value:
            try:
                re.compile(pattern)
            except (re.error, OverflowError, RecursionError) as exc:
                raise ValueError(f"bad regular expression {_shown(pattern)}: {exc}") from None
        return value


@dataclass(frozen=True)
class Rule:
    """A validated rule, ready to match; ``source`` is the file it came from."""

    spec: RuleSpec
    source: str
    regexes: tuple[re.Pattern[str], ...]
    unless: tuple[re.Pattern[str], ...]

    @property
    def id(self) -> str:
        return self.spec.id

    @property
    def action(self) -> Action:
        """The action hint: explicit in the rule, or derived from what the fault means."""
        spec = self.spec
        if spec.action is not None:
            return spec.action
        if spec.severity is not Severity.FATAL:
            return Action.NONE
        if not spec.retriable:
            return Action.FAIL
        return Action.RESTART_EXCLUDING_NODES if spec.node_at_fault else Action.RESTART

    def position(self, line: str) -> int | None:
        """Where the first pattern matches in ``line`` (for evidence windows), or None."""
        for regex in self.regexes:
            found = regex.search(line)
            if found:
                return found.start()
        return None

    def matches(self, line: str) -> bool:
        """True when a pattern matches ``line`` and no ``unless`` pattern does."""
        if not any(regex.search(line) for regex in self.regexes):
            return False
        return not any(regex.search(line) for regex in self.unless)


def _flags(spec: RuleSpec) -> int:
    return re.IGNORECASE if spec.ignore_case else 0


def _build(spec: RuleSpec, source: str) -> Rule:
    flags = _flags(spec)
    return Rule(
        spec=spec,
        source=source,
        regexes=tuple(re.compile(p, flags) for p in spec.patterns),
        unless=tuple(re.compile(p, flags) for p in spec.unless),
    )


def _shown(text: str, limit: int = 120) -> str:
    """``repr`` of a user string, cut so that an error message stays one short line."""
    return repr(text) if len(text) <= limit else repr(text[:limit]) + f"… ({len(text)} chars)"


def _describe(error: ValidationError, source: str, rule_id: str) -> str:
    problems = []
    for item in error.errors():
        where = ".".join(str(part) for part in item["loc"]) or "(rule)"
        problems.append(f"field {where!r}: {item['msg']}")
    return f"{source}: rule {rule_id}: " + "; ".join(problems)


def _check_regexes(spec: RuleSpec, source: str) -> None:
    """Refuse a pattern that could take super-linear time or match the empty string."""
    for field in ("patterns", "unless"):
        for pattern in getattr(spec, field):
            problem = regex_problem(pattern, spec.ignore_case)
            if problem is not None:
                raise CatalogError(
                    f"{source}: rule {spec.id!r}: field {field!r}: pattern {_shown(pattern)} {problem}"
                )


def _refuse_aliases(text: str, source: str) -> None:
    """Refuse YAML aliases: ``*a`` repeated in nested lists expands to gigabytes."""
    try:
        for event in yaml.parse(text, Loader=_LOADER):
            if isinstance(event, yaml.AliasEvent):
                line = event.start_mark.line + 1 if event.start_mark else "?"
                raise CatalogError(f"{source}: line {line}: YAML aliases (*name) are not allowed in a catalog")
    except yaml.YAMLError as exc:
        raise CatalogError(f"{source}: not valid YAML: {_one_line(exc)}") from None


def _one_line(error: Exception) -> str:
    return " ".join(str(error).split())


def parse_catalog(text: str, source: str) -> list[Rule]:
    """Parse one catalog file's text; raise :class:`CatalogError` naming what is wrong."""
    _refuse_aliases(text, source)
    try:
        document = yaml.load(text, Loader=_LOADER)
    except yaml.YAMLError as exc:
        raise CatalogError(f"{source}: not valid YAML: {_one_line(exc)}") from None
    if not isinstance(document, dict) or not isinstance(document.get("rules"), list):
        raise CatalogError(f"{source}: expected a mapping with a 'rules:' list")
    defaults = document.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise CatalogError(f"{source}: 'defaults' must be a mapping")
    rules = []
    for index, raw in enumerate(document["rules"]):
        if not isinstance(raw, dict):
            raise CatalogError(f"{source}: rule #{index + 1}: expected a mapping")
        rule_id = _shown(str(raw.get("id", f"#{index + 1}")), 80)
        merged: dict[str, Any] = {**defaults, **raw}
        try:
            spec = RuleSpec.model_validate(merged)
        except ValidationError as exc:
            raise CatalogError(_describe(exc, source, rule_id)) from None
        if not spec.patterns and not spec.exit_codes and not spec.reasons:
            raise CatalogError(
                f"{source}: rule {rule_id}: field 'patterns': "
                "a rule needs patterns, exit_codes or reasons"
            )
        _check_regexes(spec, source)
        rules.append(_build(spec, source))
    return rules


def load_catalog_files(paths: Iterable[Path]) -> list[Rule]:
    """Load catalog files in order; a user file cannot reuse a shipped rule id."""
    rules: list[Rule] = []
    for path in paths:
        rules.extend(parse_catalog(read_catalog_text(path), str(path)))
    check_unique(rules)
    return rules


def read_catalog_text(path: Path) -> str:
    """A catalog file's text, refusing what is not a regular file of bounded size.

    Opened without blocking (a FIFO would otherwise wait for a writer) and read
    with a bound (``/dev/zero`` never ends), then decoded as UTF-8.
    """
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise CatalogError(f"{path}: cannot read catalog: {exc.strerror or exc}") from None
    try:
        data = _read_regular(descriptor, path)
    finally:
        os.close(descriptor)
    if len(data) > MAX_CATALOG_BYTES:
        raise CatalogError(f"{path}: cannot read catalog: larger than {MAX_CATALOG_BYTES} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CatalogError(f"{path}: cannot read catalog: not UTF-8 ({exc.reason} at byte {exc.start})") from None


def _read_regular(descriptor: int, path: Path) -> bytes:
    """Up to one byte more than the limit from an open file, which must be a regular file."""
    if not stat.S_ISREG(os.fstat(descriptor).st_mode):
        raise CatalogError(f"{path}: cannot read catalog: not a regular file")
    chunks: list[bytes] = []
    left = MAX_CATALOG_BYTES + 1
    try:
        while left > 0 and (chunk := os.read(descriptor, min(left, 1 << 20))):
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as exc:
        raise CatalogError(f"{path}: cannot read catalog: {exc.strerror or exc}") from None
    return b"".join(chunks)


def check_unique(rules: Sequence[Rule]) -> None:
    seen: dict[str, str] = {}
    for rule in rules:
        if rule.id in seen:
            raise CatalogError(
                f"{rule.source}: rule {rule.id!r}: field 'id': duplicate id, "
                f"already defined in {seen[rule.id]}"
            )
        seen[rule.id] = rule.source


def shipped_catalog_files() -> list[Path]:
    """The catalog files shipped inside the package, in a stable order."""
    folder = resources.files("kcover.classify") / "catalog"
    return sorted(Path(str(entry)) for entry in folder.iterdir() if entry.name.endswith(".yaml"))
