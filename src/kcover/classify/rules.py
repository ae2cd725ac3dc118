"""Fault rules as data: the schema of a catalog file and its loader.

The catalog is YAML shipped with the package (``kcover/classify/catalog/*.yaml``)
plus any files the user adds.  Each file holds ``rules:`` (a list) and optional
``defaults:`` merged under every rule of that file.  A rule names its patterns
(Python regular expressions, also compiled by Hyperscan in prefilter mode; a
rule may give the engine a looser ``prefilter`` to scan for instead), what
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

Those checks are most of kcover's start-up time, and their outcome depends
only on the file's text and on kcover's code, so a file that passed them is
remembered (:mod:`kcover.classify.diskcache`, keyed by a digest of both) and
the next load only rebuilds its rules.  A rule's regexes are compiled the first
time the rule is tried on a line (:class:`LazyRegexes`): a scan compiles only
the rules its log makes it try.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import stat
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import cache, cached_property
from importlib import resources
from pathlib import Path
from typing import Any, overload

import pydantic
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from kcover.classify.diskcache import read_cached, write_cached
from kcover.faults import Action, Category, Role, Severity

UNLESS_AFTER_LINES = 60
"""How far back a rule's ``unless_after`` lines are looked for (a logged traceback is shorter)."""

MAX_CATALOG_BYTES = 4 << 20
"""Largest catalog file read (the shipped files are about 20 KB each)."""

NODE_GROUP = "node"
"""The one named group a pattern may have: the node the line names (a Kubernetes name is at most 253 chars)."""
MAX_NODE_LIST = 1000
"""The most characters of a node group read: a name, or a host list (``gpu-[01-64],cpu-[1-8]``)."""


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
    unless_after: list[str] = Field(default_factory=list)
    """A line within :data:`UNLESS_AFTER_LINES` before this one, in the same log, that makes it no fault
    (the program logged the exception and went on); checked on each log's kept end."""
    prefilter: list[str] = Field(default_factory=list)
    priority: int = Field(default=50, ge=0, le=100)
    action: Action | None = None
    exit_codes: list[int] = Field(default_factory=list)
    refine_by_words: bool = False
    """A generic rule (no layer in its sentence): the layer its line's words name may replace its category."""
    only_named_node: bool = False
    """The node at fault is the one the matched line names (its pattern's ``(?P<node>…)`` group), never the node
    whose log holds the line: a scheduler's report about another node.  A line that names none blames no node."""
    reasons: list[str] = Field(default_factory=list)
    examples: list[str] = Field(default_factory=list)
    counter_examples: list[str] = Field(default_factory=list)

    @field_validator("patterns", "unless", "unless_after", "prefilter")
    @classmethod
    def _regexes_compile(cls, value: list[str], info: ValidationInfo) -> list[str]:
        if info.context is _CHECKED:
            return value
        for pattern in value:
            try:
                re.compile(pattern)
            except (re.error, OverflowError, RecursionError) as exc:
                raise ValueError(f"bad regular expression {_shown(pattern)}: {exc}") from None
        return value


_CHECKED: dict[str, bool] = {"checked": True}
"""Validation context of a rule read back from the cache: its patterns already compiled and passed the lint."""


class LazyRegexes(Sequence["re.Pattern[str]"]):
    """A rule's patterns, compiled together the first time any of them is used.

    Compares and hashes like the tuple of compiled patterns it stands for.
    """

    __slots__ = ("_compiled", "_flags", "_patterns")

    def __init__(self, patterns: Sequence[str], flags: int = 0) -> None:
        self._patterns = tuple(patterns)
        self._flags = flags
        self._compiled: tuple[re.Pattern[str], ...] | None = None

    def compiled(self) -> tuple[re.Pattern[str], ...]:
        """The compiled patterns (compiled now if this is the first use)."""
        if self._compiled is None:
            self._compiled = tuple(re.compile(pattern, self._flags) for pattern in self._patterns)
        return self._compiled

    @overload
    def __getitem__(self, index: int) -> re.Pattern[str]: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[re.Pattern[str], ...]: ...

    def __getitem__(self, index: int | slice) -> re.Pattern[str] | tuple[re.Pattern[str], ...]:
        return self.compiled()[index]

    def __len__(self) -> int:
        return len(self._patterns)

    def __iter__(self) -> Iterator[re.Pattern[str]]:
        return iter(self.compiled())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, LazyRegexes):
            other = other.compiled()
        return isinstance(other, tuple) and self.compiled() == other

    def __hash__(self) -> int:
        return hash(self.compiled())

    def __repr__(self) -> str:
        return f"LazyRegexes({self._patterns!r}, {self._flags!r})"


@dataclass(frozen=True)
class Rule:
    """A validated rule, ready to match; ``source`` is the file it came from."""

    spec: RuleSpec
    source: str
    regexes: Sequence[re.Pattern[str]]
    unless: Sequence[re.Pattern[str]]
    unless_after: Sequence[re.Pattern[str]] = ()

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

    @cached_property
    def names_nodes(self) -> bool:
        """Whether a pattern of this rule names a node (``(?P<node>…)``)."""
        return any(f"(?P<{NODE_GROUP}>" in pattern for pattern in self.spec.patterns)

    def locate(self, line: str) -> tuple[int | None, str | None]:
        """Where the first matching pattern matches in ``line``, and the node it names (its ``node`` group)."""
        for regex in self.regexes:
            found = regex.search(line)
            if found:
                return found.start(), _node_name(found)
        return None, None

    def matches(self, line: str) -> bool:
        """True when a pattern matches ``line`` and no ``unless`` pattern does."""
        if not any(regex.search(line) for regex in self.regexes):
            return False
        return not any(regex.search(line) for regex in self.unless)


def _node_name(found: re.Match[str]) -> str | None:
    """The node (or host list) a match names, without the punctuation a sentence puts after it; None for none.

    A host list's closing bracket (``gpu-[01-02]``) is part of it, not punctuation.
    """
    if NODE_GROUP not in found.re.groupindex:
        return None
    name = (found.group(NODE_GROUP) or "")[:MAX_NODE_LIST]
    while name and name[-1] in ".,;:)]'\"-" and not (name[-1] == "]" and name.count("[") == name.count("]")):
        name = name[:-1]
    return name if name.isprintable() and name else None


def _flags(spec: RuleSpec) -> int:
    return re.IGNORECASE if spec.ignore_case else 0


def _build(spec: RuleSpec, source: str) -> Rule:
    flags = _flags(spec)
    return Rule(
        spec=spec,
        source=source,
        regexes=LazyRegexes(spec.patterns, flags),
        unless=LazyRegexes(spec.unless, flags),
        unless_after=LazyRegexes(spec.unless_after, flags),
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
    from kcover.classify.lint import regex_problem  # only when a catalog is checked, not read from the cache

    for field in ("patterns", "unless", "unless_after", "prefilter"):
        for pattern in getattr(spec, field):
            problem = regex_problem(pattern, spec.ignore_case)
            if problem is not None:
                raise CatalogError(
                    f"{source}: rule {spec.id!r}: field {field!r}: pattern {_shown(pattern)} {problem}"
                )


def _check_named_node(spec: RuleSpec, source: str, rule_id: str) -> None:
    """A pattern names only the node (``(?P<node>…)``), and a rule that blames only named nodes can name one."""
    naming = False
    for pattern in spec.patterns:
        groups = set(re.compile(pattern).groupindex)
        if groups - {NODE_GROUP}:
            raise CatalogError(f"{source}: rule {rule_id}: field 'patterns': pattern {_shown(pattern)} has a named "
                               f"group other than (?P<{NODE_GROUP}>…): {', '.join(sorted(groups - {NODE_GROUP}))}")
        naming = naming or NODE_GROUP in groups
    if not spec.only_named_node:
        return
    if not spec.node_at_fault or not naming or spec.reasons or spec.exit_codes:
        raise CatalogError(f"{source}: rule {rule_id}: field 'only_named_node': needs node_at_fault: true, a pattern "
                           f"with a (?P<{NODE_GROUP}>…) group, and no reasons or exit_codes (they name no node)")


def _loader() -> Any:
    """PyYAML's safe loader (in C when built), imported only when a catalog has to be read."""
    import yaml

    return getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _refuse_aliases_and_repeated_keys(text: str, source: str) -> None:
    """Refuse YAML aliases (``*a`` repeated in nested lists expands to gigabytes) and a key given twice in
    one mapping (YAML keeps the last silently: a second ``counter_examples:`` would drop the first list)."""
    import yaml

    frames: list[dict[str, Any] | None] = []  # per open collection: a mapping's keys so far, None for a list
    try:
        for event in yaml.parse(text, Loader=_loader()):
            line = event.start_mark.line + 1 if event.start_mark else "?"
            if isinstance(event, yaml.AliasEvent):
                raise CatalogError(f"{source}: line {line}: YAML aliases (*name) are not allowed in a catalog")
            if isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                frames.pop()
                continue
            if not isinstance(event, (yaml.ScalarEvent, yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                continue
            mapping = frames[-1] if frames else None
            if mapping is not None:
                if mapping["want_key"] and isinstance(event, yaml.ScalarEvent):
                    key = (event.value, event.style)  # `1` and `'1'` are different keys
                    if key in mapping["keys"]:
                        raise CatalogError(f"{source}: line {line}: the key {event.value!r} is given twice")
                    mapping["keys"].add(key)
                mapping["want_key"] = not mapping["want_key"]
            if isinstance(event, yaml.MappingStartEvent):
                frames.append({"keys": set(), "want_key": True})
            elif isinstance(event, yaml.SequenceStartEvent):
                frames.append(None)
    except yaml.YAMLError as exc:
        raise CatalogError(f"{source}: not valid YAML: {_one_line(exc)}") from None


def _one_line(error: Exception) -> str:
    return " ".join(str(error).split())


def parse_catalog(text: str, source: str) -> list[Rule]:
    """Parse one catalog file's text; raise :class:`CatalogError` naming what is wrong.

    A text that passed every check before is rebuilt from the cache without
    checking it again; a text that fails is never cached, so its error is
    raised afresh each time.
    """
    name = f"catalog-{_catalog_digest(text)}.json"
    specs = _cached_specs(name)
    if specs is None:
        specs = _checked_specs(text, source)
        write_cached(name, json.dumps([spec.model_dump(mode="json") for spec in specs]).encode())
    return [_build(spec, source) for spec in specs]


@cache
def _code_digest() -> str:
    """A digest of everything besides the text that decides whether a catalog passes, and what it holds."""
    here = Path(__file__).parent
    digest = hashlib.sha256()
    modules = [Path(__file__), here / "lint.py", here.parent / "faults.py"]
    yaml = importlib.util.find_spec("yaml")  # its __init__ names its version: found, not imported
    if yaml is not None and yaml.origin is not None:
        modules.append(Path(yaml.origin))
    for module in modules:
        digest.update(module.read_bytes())
    digest.update(f"{sys.version}|{pydantic.VERSION}".encode())
    return digest.hexdigest()


def _catalog_digest(text: str) -> str:
    return hashlib.sha256(f"{_code_digest()}\n{text}".encode("utf-8", errors="surrogatepass")).hexdigest()[:32]


def _cached_specs(name: str) -> list[RuleSpec] | None:
    """The rules of a catalog text that passed before, or None when the cache has none (or a damaged file)."""
    data = read_cached(name)
    if data is None:
        return None
    try:
        return [RuleSpec.model_validate(item, context=_CHECKED) for item in json.loads(data)]
    except (ValueError, TypeError):  # bad JSON or a rule that no longer validates: check the text again
        return None


def _checked_specs(text: str, source: str) -> list[RuleSpec]:
    """Every rule of one catalog text, through every check."""
    import yaml

    _refuse_aliases_and_repeated_keys(text, source)
    try:
        document = yaml.load(text, Loader=_loader())
    except yaml.YAMLError as exc:
        raise CatalogError(f"{source}: not valid YAML: {_one_line(exc)}") from None
    if not isinstance(document, dict) or not isinstance(document.get("rules"), list):
        raise CatalogError(f"{source}: expected a mapping with a 'rules:' list")
    defaults = document.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise CatalogError(f"{source}: 'defaults' must be a mapping")
    rules: list[RuleSpec] = []
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
        if spec.prefilter and not spec.patterns:
            raise CatalogError(f"{source}: rule {rule_id}: field 'prefilter': a prefilter stands in for the "
                               "rule's patterns in the scanning engine; this rule has no patterns")
        _check_regexes(spec, source)
        _check_named_node(spec, source, rule_id)
        rules.append(spec)
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
