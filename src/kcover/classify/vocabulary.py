"""Which layer a failure line names, when no rule knows the sentence.

Two verdicts name no layer of the stack: the fallback's failure that no rule
recognises (:mod:`kcover.classify.fallback`, category ``other``) and an
exception line that only the generic ``python.exception`` rule matched
(category ``user_code``).  Yet their lines often say where the failure was: a
``RuntimeError`` about an NCCL communicator, an ``Exception`` about an
uncorrectable error.  :func:`layer_of` reads those words, from the table in
``vocabulary.yaml`` (the words of each category, with the sources they come
from), and says which category they point to, or ``None``.

Only the category of such a fault changes; its rule, its retry budget and its
blame stay those of the generic verdict (a guess never excludes a node).  The
table's patterns pass the catalog's linear-time check when it is loaded, and
only :data:`MATCH_CHARS` of a line are read.  Pure computation, no I/O after
the first load.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources

import yaml
from pydantic import BaseModel, ConfigDict, Field

from kcover.classify.lint import regex_problem
from kcover.faults import Category

MATCH_CHARS = 2000
"""Only this much of a line is read: the words that name a layer sit near its head."""


class LayerSpec(BaseModel):
    """One layer as written in ``vocabulary.yaml``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    category: Category
    words: list[str] = Field(min_length=1)
    unless: list[str] = Field(default_factory=list)
    examples: list[str] = Field(min_length=1)
    counter_examples: list[str] = Field(default_factory=list)


class LastLineSpec(BaseModel):
    """The words of a last line that says something failed, and the shapes of lines that never fail."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    failure: list[str] = Field(min_length=1)
    not_failure: list[str] = Field(default_factory=list)
    not_failure_phrases: list[str] = Field(default_factory=list)
    examples: list[str] = Field(min_length=1)
    counter_examples: list[str] = Field(default_factory=list)


class VocabularySpec(BaseModel):
    """The whole table: lines never re-categorised, the layers in the order they are tried, the last-line words."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    keep: list[str] = Field(default_factory=list)
    layers: list[LayerSpec] = Field(min_length=1)
    last_line: LastLineSpec


@dataclass(frozen=True)
class Layer:
    """One layer, compiled."""

    spec: LayerSpec
    words: tuple[re.Pattern[str], ...]
    unless: tuple[re.Pattern[str], ...]

    def named_by(self, text: str) -> bool:
        """Whether ``text`` uses this layer's words (and none of its exceptions)."""
        return any(word.search(text) for word in self.words) and not any(no.search(text) for no in self.unless)


@dataclass(frozen=True)
class Vocabulary:
    """The compiled table."""

    keep: tuple[re.Pattern[str], ...]
    layers: tuple[Layer, ...]
    failure: tuple[re.Pattern[str], ...]
    not_failure: tuple[re.Pattern[str], ...]
    not_failure_phrases: tuple[re.Pattern[str], ...]


def _compiled(patterns: Sequence[str], where: str) -> tuple[re.Pattern[str], ...]:
    for pattern in patterns:
        problem = regex_problem(pattern)
        if problem is not None:
            raise ValueError(f"vocabulary.yaml: {where}: pattern {pattern[:80]!r} {problem}")
    return tuple(re.compile(pattern) for pattern in patterns)


def parse_vocabulary(text: str) -> Vocabulary:
    """The table from its YAML text; every pattern checked for linear time."""
    spec = VocabularySpec.model_validate(yaml.safe_load(text))
    layers = tuple(
        Layer(layer, _compiled(layer.words, layer.category.value), _compiled(layer.unless, layer.category.value))
        for layer in spec.layers
    )
    return Vocabulary(
        _compiled(spec.keep, "keep"),
        layers,
        _compiled(spec.last_line.failure, "last_line.failure"),
        _compiled(spec.last_line.not_failure, "last_line.not_failure"),
        _compiled(spec.last_line.not_failure_phrases, "last_line.not_failure_phrases"),
    )


@cache
def shipped_vocabulary() -> Vocabulary:
    """The table shipped with kcover, read and checked once per process."""
    return parse_vocabulary(resources.files("kcover.classify").joinpath("vocabulary.yaml").read_text("utf-8"))


def layer_of(texts: Sequence[str], vocabulary: Vocabulary | None = None) -> Category | None:
    """The category the words of these lines name (the evidence line first), or ``None``.

    ``None`` also when the first line names a programming mistake (a
    ``ValueError``, an ``Expected all tensors …`` message): the words after it
    are then the program's, not a layer's.
    """
    table = vocabulary or shipped_vocabulary()
    heads = [text[:MATCH_CHARS] for text in texts]
    if not heads or any(keep.search(heads[0]) for keep in table.keep):
        return None
    for head in heads:
        for layer in table.layers:
            if layer.named_by(head):
                return layer.spec.category
    return None


def says_failed(text: str, vocabulary: Vocabulary | None = None) -> bool:
    """Whether a line, read alone, says something failed: a failure word, in none of the shapes that never fail.

    The test of the fallback's last-line rule (``last_line`` in
    ``vocabulary.yaml``): ``RmInitAdapter failed!`` says so; ``Uncorrectable
    Error : N/A``, ``0 failed``, ``[W310 …] … has failed to connect`` and
    ``--abort-on-error  Abort when …`` do not.  A phrase that takes the word
    back (``0/8 ranks failed``, ``if … fails``) counts only where it holds the
    word: ``failed when posting …; device disabled`` still says failed.
    """
    table = vocabulary or shipped_vocabulary()
    head = text[:MATCH_CHARS]
    words = [found.span() for word in table.failure for found in word.finditer(head)]
    if not words or any(shape.search(head) for shape in table.not_failure):
        return False
    taken_back = [found.span() for phrase in table.not_failure_phrases for found in phrase.finditer(head)]
    return any(not any(start <= begin and end <= stop for start, stop in taken_back) for begin, end in words)
