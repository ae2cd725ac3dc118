"""Unknown fatal text is still a verdict: the failure no catalog rule names.

When no rule matches but a log plainly ends in failure (a Python exception
line closing a traceback, a fatal or error line of a known logger format, an
abort banner, a non-zero exit noted in the log), the job did fail and "no
fault" would be wrong.  This module finds that line and makes it the evidence
of a fault of rule :data:`~kcover.faults.UNRECOGNISED_FAILURE_RULE`, retriable,
whose restarts the recovery policy counts against the user-code retry budget.
Its category is ``other``, or the layer that the words of the line (and of the
lines after it that say more, such as a C++ exception's ``what():``) name
(:mod:`kcover.classify.vocabulary`): "the NCCL communicator was poisoned" is
an NCCL failure even in a sentence no rule knows.

It is cheap by construction: while the scanner streams a source it only keeps
the last :data:`TAIL_BYTES` of it (:class:`TailKeeper`, an append per block), and the
tail is read once, when the verdict is formed, and only when no rule explained
the failure.  Nothing else is ever re-scanned.

Reading a tail, from its last line backwards:

- a *fatal-looking* line is a candidate; the best kind in the final stretch is
  the evidence (an exception line over a fatal-level line, over an
  error-level line, over an abort banner, over an exit status), the last one
  of that kind when several; error-level lines alone are not enough;
- a line that shows the job went on (a training step, a loss, a progress bar,
  "retrying", "continuing", "saved checkpoint") ends the final stretch: a
  caught-and-logged traceback followed by more steps is not a failure;
- a log whose last line says something failed in a layer's words
  (``NVRM: … RmInitAdapter failed!``, an excerpt pasted without any logger
  level) ended in that failure, unless the line has a shape healthy output
  has (a warning level, a counter at zero, an option's help, a shell trace:
  ``last_line`` in ``vocabulary.yaml``) or says it recovers;
- epilogue lines (traceback frames, separators, torchrun's failure summary,
  ``wandb:`` sync lines, teardown warnings) are passed over; at most
  :data:`SLACK_LINES` other lines are, so a log that ends in ordinary chatter
  after an old error is not called failed.

Error levels count only where they mean failure: in glog-style formats
(glog, TensorFlow, PyTorch's ``[E …]``) ``E`` lines are routine noise (a cuDNN
factory registered twice, a socket connect that is retried), so only their
``F`` (fatal) level is taken.  Python logging's ``CRITICAL`` and ``FATAL``
count alone; its ``ERROR`` (and Slurm's ``srun: error:``) only beside
another sign in the final stretch (an exit status, an abort, an exception).  A bare ``Traceback (most recent
call last):`` counts only when the log stops inside that traceback, and an
exception that only says a side service was unreachable (``ConnectionError``,
``TimeoutError``) or that the user pressed Ctrl-C never counts.

Pure computation on bytes already read: no I/O, no clock.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import IntEnum

from kcover.classify.exit_codes import FALLBACK_RULE
from kcover.classify.vocabulary import layer_of, says_failed
from kcover.collect.lines import LogLine, evidence_text, parse_line
from kcover.collect.sources import SourceInfo
from kcover.faults import UNRECOGNISED_FAILURE_RULE, Category, Evidence, Fault, Role, Severity

TAIL_BYTES = 16 << 10
"""Bytes kept from the end of each source."""
TAIL_LINES = 60
"""Lines of the tail read backwards at most."""
SLACK_LINES = 4
"""Ordinary lines (neither fatal, epilogue nor progress) tolerated in the final stretch."""
_MATCH_CHARS = 2000
"""Only this much of a line is given to a regex: the signs sit at its head."""

EXIT_REPORT_RULES = frozenset({FALLBACK_RULE, "torch.elastic-child-failed", "python.fatal-error"})
"""Catalog rules that only report that the program died (a non-zero exit, an uncaught C++ exception whose
``what():`` no rule knows), not why: a tail's failure line may explain them."""

TITLE = "Failure no rule recognises (the log ends in an error)"
REMEDIATION = (
    "The job failed with an error that kcover has no rule for; the evidence is the last fatal-looking "
    "line of the log. Restarted within the user-code retry budget, in case it was a fluke. Read the lines "
    "before it; if the error recurs, fix it, or add a rule for it to a custom catalog (--catalog)."
)
PRIORITY = 1


class Kind(IntEnum):
    """How a fatal-looking line shows failure; a higher kind is better evidence."""

    EXIT = 1
    ABORT = 2
    ERROR = 3
    """An error-level line: libraries log errors they survive, so it counts only beside another kind."""
    LOGGED = 4
    """A fatal-level line (glog ``F``, ``CRITICAL``, ``FATAL``)."""
    EXCEPTION = 5


@dataclass(frozen=True)
class Tail:
    """The last bytes of one source: ``lines`` line breaks were read up to its end; ``cut`` when bytes came before.

    ``survived``: the numbers of lines a rule found logged and survived (a
    fault its ``unless_after`` lines excused): the job went on past them.
    ``degraded``: the numbers of lines a rule named a degraded sign (Xid 92,
    a retired page): explained, and no failure of their own.
    """

    data: bytes
    lines: int
    cut: bool = False
    survived: frozenset[int] = frozenset()
    degraded: frozenset[int] = frozenset()


class TailKeeper:
    """Keeps the end of one stream as it is read: appends in place, trims at twice :data:`TAIL_BYTES`.

    Appending copies only the new block (amortised), so a worker that writes
    one line at a time costs the launcher's pump nothing it would notice.
    """

    def __init__(self) -> None:
        self._data = bytearray()
        self._settled: bytes | None = None
        """The tail once its stream ended (:meth:`settle`): the one copy :meth:`tail` hands out."""
        self._lines = 0
        self._cut = False

    def add(self, block: bytes, lines: int) -> None:
        """One more cleaned block; ``lines`` counts the line breaks read through it."""
        if self._settled is not None:  # the stream goes on (a rotated file's log after it)
            self._data, self._settled = bytearray(self._settled), None
        self._lines = lines
        if len(block) >= TAIL_BYTES:
            self._cut = self._cut or bool(self._data) or len(block) > TAIL_BYTES
            self._data[:] = block[-TAIL_BYTES:]
            return
        self._data += block
        if len(self._data) > 2 * TAIL_BYTES:
            del self._data[:-TAIL_BYTES]
            self._cut = True

    def settle(self) -> None:
        """The stream ended: keep only :data:`TAIL_BYTES`, as the bytes :meth:`tail` will hand out.

        A job of thousands of logs would otherwise hold up to twice that for
        each, and a copy of each tail again while the verdict is formed.
        """
        if self._settled is None:
            self._cut = self._cut or len(self._data) > TAIL_BYTES
            self._settled, self._data = bytes(self._data[-TAIL_BYTES:]), bytearray()

    def tail(self) -> Tail:
        """What was kept, as an immutable :class:`Tail` of at most :data:`TAIL_BYTES`."""
        if self._settled is not None:
            return Tail(self._settled, self._lines, cut=self._cut)
        data = bytes(self._data[-TAIL_BYTES:])
        return Tail(data, self._lines, cut=self._cut or len(self._data) > TAIL_BYTES)


_STAMP = re.compile(
    r"^\[?\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?\]?[\s:|\-]*"
    r"|^\[\s*\d+\.\d+\]\s*"
)
_EXCEPTION = re.compile(r"^(?:[A-Za-z_]\w*\.)*(?P<name>[A-Za-z_]\w*)(?::(?:\s(?P<message>.*))?)?$")
_FAILURE_NAME = re.compile(r"(?:Error|Exception|Exit|Failure|Fault)$")
_NOT_FAILURE_NAME = re.compile(
    r"Warning$|^(?:KeyboardInterrupt|GeneratorExit|BdbQuit)$"
    r"|^(?:Connection\w*Error|BrokenPipeError|TimeoutError)$"
)
"""Not the program failing: a stop request, a warning, or a side service (metrics, dashboards) not reachable."""
_CHILD_FAILED = re.compile(r"^(?:\w+\.)*ChildFailedError\b")
"""torchrun's report that a worker exited non-zero: an exit status, the worker's own lines say why."""
_FRAME = re.compile(r'^\s+File "|^Traceback \(most recent call last\)')
_WHAT = re.compile(r"^\s*what\(\):")
_TRACEBACK = re.compile(r"^Traceback \(most recent call last\):$")
_GLOG_FATAL = re.compile(
    r"^(?:"
    r"F\d{4} \d\d:\d\d:\d\d(?:\.\d+)?\s+(?:\d+\s+)?\S+:\d+\]"  # glog: F1201 12:00:00.000 1234 file.cc:12]
    r"|\[F\d{4} \d\d:\d\d:\d\d[^\]]{0,200}\]"  # c10: [F1201 12:00:00.123 1234 ProcessGroupNCCL.cpp:12]
    r"|\[F [^\]\s]{1,200}\]"  # older c10: [F ProcessGroupNCCL.cpp:1414]
    r"|F \S{1,200}\.(?:cc|cpp|c|h|py):\d+\]"  # TensorFlow, after its timestamp: F tensorflow/x.cc:12]
    r")"
)


def _level(levels: str) -> re.Pattern[str]:
    """A Python-logging style line at one of ``levels`` (``ERROR|CRITICAL``), in the common formats."""
    return re.compile(
        rf"^(?:(?:{levels}):\S*:"  # logging.basicConfig: ERROR:root:
        rf"|\[?(?:{levels})\]?(?:[\s:|\-]|$)"  # ERROR ..., [ERROR] ..., ERROR    | (loguru)
        rf"|[^\n]{{0,160}}?\s[-|]\s(?:{levels})\s*(?:[-|:]|$)"  # name - ERROR - message
        rf"|[^\n]{{0,160}}?\[(?:{levels})\])"  # [time][name][ERROR]
    )


_FATAL_LEVEL = _level("CRITICAL|FATAL")
_ERROR_LEVEL = _level("ERROR")
_SLURM_ERROR = re.compile(r"^(?:srun|slurmstepd): error: ")
_ABORT = re.compile(
    r"terminate called (?:after throwing|without an active exception)"
    r"|\(core dumped\)|^Aborted\b"
    r"|Segmentation fault|^Bus error|Illegal instruction|Floating point exception"
    r"|Fatal Python error"
    r"|^\*\*\* (?:Aborted at|SIG[A-Z]+|Error in|An error occurred in|Process received signal|Received signal)"
    r"|^Killed$|\bCheck failed: "
    r"|MPI_ABORT was invoked|mpirun noticed that process|job has been aborted"
)
_EXIT = re.compile(
    r"(?i)\b(?:exit(?:ed)?\s+(?:with\s+)?(?:exit\s+)?(?:code|status)|exit_?code|return(?:ed)?\s+code)"
    r"\s*[:=]?\s*\(?-?0*[1-9]\d*"
    r"|non-zero exit (?:code|status)"
    r"|^\+ exit [1-9]"
)
_RECOVERY = re.compile(
    r"(?i)\b(?:retry|retrying|retried|will retry|recovered|recovering|resum(?:e|ed|ing)|continu(?:e|ed|ing)"
    r"|ignor(?:e|ed|ing)|skip(?:ped|ping)?|fall(?:ing)? ?back|instead|non-fatal|harmless|restarting"
    r"|will restart|reconnect(?:ed|ing)?|successfully)\b"
    r"|not a git repository"  # the commit probe of many training scripts, harmless
)
_STEP = re.compile(
    r"(?i)\b(?:step|steps|iter|iteration|epoch|global_step|batch)\b\s*[:=#\[]?\s*\d"
    r"|\bloss\b\s*[:=]?\s*-?\d"
    r"|\b(?:saved|saving) (?:checkpoint|model)"
    r"|\b(?:training|job|run) (?:finished|completed?|done|succeeded)\b"
    r"|\b(?:start(?:s|ing|ed)?|begin(?:s|ning)?)\b[^\n]{0,40}?\btrain"
)
_BAR = re.compile(r"\d+%\||\d+/\d+ \[\d|\b(?:it/s|s/it)\b")
"""A progress bar (tqdm), indented or not; :data:`_STEP` counts only on unindented lines (not source code)."""
_EPILOGUE = re.compile(
    r"^\s|^$"
    r"|^Traceback \(most recent call last\)"
    r"|^During handling of the above exception|^The above exception was the direct cause"
    r"|^[\W_]+$"
    r"|^(?:frame #|#)\d+|^Exception raised from |what\(\):|^\*\*\*"
    r"|^wandb:"
    r"|^\[W[\d ]|^W\d{4} |^(?:\S*:\d+: )?\w*Warning\b"
    r"|^(?:time|host|rank|local_rank|exitcode|error_file|traceback|pid)\s*:"
    r"|^(?:Failures|Root Cause|Other Failures)\b|<NO_OTHER_FAILURES>|^\[\d+\]:?$"
)


def strip_stamp(text: str) -> str:
    """The line without a leading timestamp (where logger levels and exception names begin)."""
    return _STAMP.sub("", text, count=1)


def _exception(texts: list[str], index: int) -> bool:
    """Whether line ``index`` is a Python exception line: a failure name, or any name right after frames."""
    found = _EXCEPTION.match(texts[index])
    if not found:
        return False
    name, message = found.group("name"), (found.group("message") or "").strip()
    if _NOT_FAILURE_NAME.search(name) or (name == "SystemExit" and message in ("", "0", "None")):
        return False
    if _FAILURE_NAME.search(name):
        return True
    previous = [text for text in texts[max(0, index - 4) : index] if text.strip()][-3:]
    return any(_FRAME.match(text) for text in previous)


def _ends_inside(texts: list[str], index: int) -> bool:
    """Whether every line after ``index`` is indented or blank: the log stops inside a traceback."""
    return all(not text or text[:1].isspace() for text in texts[index + 1 :])


def kind_of(texts: list[str], index: int) -> Kind | None:
    """How line ``index`` of a tail shows failure, if it does (``texts``: the lines, prefixes stripped)."""
    text = texts[index]
    head = strip_stamp(text)
    if _CHILD_FAILED.match(text):
        return Kind.EXIT
    if _exception(texts, index):
        return Kind.EXCEPTION
    if _GLOG_FATAL.match(head) or _FATAL_LEVEL.match(head):
        return Kind.LOGGED
    if _EXIT.search(head):  # also an error-level line that only reports an exit status (torchrun's)
        return Kind.EXIT
    if _ERROR_LEVEL.match(head) or _SLURM_ERROR.match(head):
        return Kind.ERROR
    if _ABORT.search(head) or (_TRACEBACK.match(text) and _ends_inside(texts, index)):
        return Kind.ABORT
    return None


def _goes_on(head: str) -> bool:
    """Whether a line shows the job went on: a step, a loss, a progress bar (``wandb:`` summaries do not count)."""
    if head.startswith("wandb:"):
        return False
    return bool(_BAR.search(head) or (not head[:1].isspace() and _STEP.search(head)))


def _ends_in_failure(
    texts: list[str], survived: frozenset[int] = frozenset(), degraded: frozenset[int] = frozenset()
) -> int | None:
    """Index of the evidence line when these lines (a tail, oldest first) end in failure, else ``None``.

    ``survived``: indices of lines the job went on past (they end the final stretch, like a step);
    ``degraded``: indices of lines a rule already named as a degraded sign (passed over).
    """
    best: tuple[Kind, int] | None = None
    kinds: set[Kind] = set()
    ordinary = 0
    for index in range(len(texts) - 1, -1, -1):
        if index in survived:
            break
        if index in degraded:
            continue
        head = strip_stamp(texts[index])
        kind = kind_of(texts, index)
        if kind is not Kind.EXCEPTION and _RECOVERY.search(head):
            break
        if kind is not None:
            kinds.add(kind)
            if best is None or kind > best[0]:
                best = (kind, index)
            continue
        if _goes_on(head):
            break
        if _EPILOGUE.match(head):
            continue
        ordinary += 1
        if ordinary > SLACK_LINES:
            break
    return best[1] if best and kinds != {Kind.ERROR} else None


def _last_line_names_layer(texts: list[str], degraded: frozenset[int] = frozenset()) -> int | None:
    """Index of the last line when it is a failure sentence in a layer's words, else ``None``.

    A log (or a pasted excerpt) that stops on ``NVRM: GPU 0000:81:00.0:
    RmInitAdapter failed!`` ended in that failure even without a logger level:
    the last non-blank line counts alone when it says something failed in none
    of the shapes of healthy output (:func:`~kcover.classify.vocabulary.says_failed`:
    not a warning, a counter at zero, an option's help, a shell trace …), does
    not go on or recover, and names a layer
    (:func:`~kcover.classify.vocabulary.layer_of`).  Lines a rule named as a
    degraded sign (``degraded``, indices) are passed over: they come after the end.
    """
    last = next(
        (index for index in range(len(texts) - 1, -1, -1) if texts[index].strip() and index not in degraded), None
    )
    if last is None:
        return None
    head = strip_stamp(texts[last])
    if not says_failed(head) or _RECOVERY.search(head) or _goes_on(head):
        return None
    return last if layer_of([head]) is not None else None


def _tail_lines(tail: Tail) -> tuple[list[LogLine], int]:
    """The decoded whole lines of a tail (at most :data:`TAIL_LINES`) and the number of the first one."""
    raw = tail.data.split(b"\n")
    if raw and raw[-1] == b"":
        raw.pop()
    first = tail.lines - tail.data.count(b"\n") + 1
    if tail.cut and len(raw) > 1:
        raw.pop(0)
        first += 1
    skipped = max(0, len(raw) - TAIL_LINES)
    return [parse_line(line[: _MATCH_CHARS * 2]) for line in raw[skipped:]], first + skipped


def _told_after(texts: list[str], index: int, degraded: frozenset[int] = frozenset()) -> tuple[str, ...]:
    """The lines after line ``index`` that say more about it: a C++ exception's ``what():``, plain text.

    Frames, source lines and the other epilogue lines are left out: they hold
    the program's words, not the failure's; so are the lines a rule named as a
    degraded sign (``degraded``, indices): they are not about this failure.
    """
    return tuple(
        text
        for after, text in enumerate(texts[index + 1 :], start=index + 1)
        if after not in degraded and (_WHAT.match(text) or not _EPILOGUE.match(text))
    )


def _told_before(texts: list[str], index: int) -> tuple[str, ...]:
    """For a bare ``Traceback`` header (a log that stops inside its frames), the line right before it.

    The header says nothing about the failure; the message the program logged
    just before its traceback ("checkpoint save failed 3 times, exiting") does,
    when it says something failed.  Any other evidence line says it itself:
    nothing before it is read.
    """
    if not _TRACEBACK.match(texts[index]):
        return ()
    before = next((text for text in reversed(texts[:index]) if text.strip()), None)
    if before is None or _EPILOGUE.match(before):
        return ()
    head = strip_stamp(before)
    if not says_failed(head) or _RECOVERY.search(head) or _goes_on(head):
        return ()  # an INFO line, a step or a retry notice is not the failure's message
    return (before,)


def lines_before(tail: Tail, line_number: int, count: int) -> list[str]:
    """The messages of up to ``count`` lines before line ``line_number`` of the log, those the tail holds."""
    lines, first = _tail_lines(tail)
    end = line_number - first
    return [line.message for line in lines[max(0, end - count) : max(0, end)]]


def failure_line(tail: Tail) -> tuple[LogLine, int, Kind, tuple[str, ...]] | None:
    """The line that shows a source ended in failure, its line number, kind and the lines that say more about it.

    ``None`` when the source did not end in failure.
    """
    lines, first = _tail_lines(tail)
    texts = [line.message[:_MATCH_CHARS] for line in lines]
    survived = frozenset(number - first for number in tail.survived)
    degraded = frozenset(number - first for number in tail.degraded)
    index = _ends_in_failure(texts, survived, degraded)
    if index is None:
        index = _last_line_names_layer(texts, degraded)
    if index is None or index in survived:  # the last line may be one the job survived
        return None
    kind = kind_of(texts, index) or Kind.ERROR
    return lines[index], first + index, kind, _told_before(texts, index) + _told_after(texts, index, degraded)


def unrecognised_fault(source: SourceInfo, line: LogLine, line_number: int, after: Sequence[str] = ()) -> Fault:
    """The fault for a failure no rule named, seen as ``line`` of ``source`` (``after``: the lines that say more).

    Its category is ``other`` unless the words of these lines name a layer
    (:func:`~kcover.classify.vocabulary.layer_of`).
    """
    category = layer_of([line.message, *after]) or Category.OTHER
    evidence = Evidence(
        source=source.name,
        line=evidence_text(line.text),
        line_number=line_number,
        timestamp=line.timestamp,
        rank=line.rank if line.rank is not None else source.rank,
        node=source.node or line.node,
    )
    return Fault(
        rule=UNRECOGNISED_FAILURE_RULE,
        category=category,
        severity=Severity.FATAL,
        retriable=True,
        node_at_fault=False,
        role=Role.ROOT,
        priority=PRIORITY,
        title=TITLE if category is Category.OTHER else f"{TITLE}; its words name {category.value}",
        remediation=REMEDIATION,
        evidence=evidence,
    )


def unexplained(faults: Sequence[Fault]) -> bool:
    """Whether no rule explains the job's end: no fatal fault, or fatal ones that only report an exit status.

    A degraded sign (Xid 92, a rising single-bit ECC rate) says the job may go
    on; it does not explain a log that then ends in failure, so the tail is
    still read.  The sign stays among the faults, named beside the failure.
    """
    return all(fault.rule in EXIT_REPORT_RULES for fault in faults if fault.is_fatal)


def fallback_faults(tails: Mapping[SourceInfo, Tail], *, beyond_exit: bool = False) -> list[Fault]:
    """One fault per source whose tail ends in failure, in source order.

    With ``beyond_exit`` (an exit status is already known) a line that only
    notes a non-zero exit adds nothing and is not taken.
    """
    faults = []
    for source, tail in tails.items():
        found = failure_line(tail)
        if found is None or (beyond_exit and found[2] is Kind.EXIT):
            continue
        faults.append(unrecognised_fault(source, found[0], found[1], found[3]))
    return faults
