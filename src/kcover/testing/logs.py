"""Container log files in the CRI format, for tests of the node agent.

KWOK runs no containers, so the fake cluster has no container logs. The kcover
node agent reads the files the kubelet writes under ``/var/log/pods``::

    <root>/<namespace>_<pod>_<pod uid>/<container>/<restart count>.log

each line ``<RFC3339Nano time> <stdout|stderr> <F|P> <text>`` (``P`` marks a
partial line that continues in the next record, ``F`` a full one). Tests call
:func:`write_container_log` to write such files into a temporary root laid out
the same way, then point the agent's log root at it.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

__all__ = ["LogLine", "container_log_path", "cri_line", "write_container_log"]

Stream = Literal["stdout", "stderr"]


@dataclass(frozen=True)
class LogLine:
    """One line of container output; ``time`` defaults to when it is written."""

    text: str
    stream: Stream = "stdout"
    time: _dt.datetime | None = None


def _rfc3339nano(when: _dt.datetime) -> str:
    when = when.astimezone(_dt.UTC)
    return when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond * 1000:09d}Z"


def cri_line(text: str, stream: Stream, when: _dt.datetime, partial: bool = False) -> str:
    """One CRI log record (with its trailing newline)."""
    return f"{_rfc3339nano(when)} {stream} {'P' if partial else 'F'} {text}\n"


def container_log_path(
    root: Path, namespace: str, pod: str, uid: str, container: str, restart: int = 0
) -> Path:
    """Where the kubelet keeps the log of ``container`` (restart ``restart``) of a pod."""
    return root / f"{namespace}_{pod}_{uid}" / container / f"{restart}.log"


def write_container_log(
    root: Path,
    namespace: str,
    pod: str,
    uid: str,
    container: str,
    lines: Iterable[str | LogLine],
    *,
    restart: int = 0,
    max_record: int = 16 * 1024,
    append: bool = True,
) -> Path:
    """Write ``lines`` as CRI records; lines longer than ``max_record`` are split into P..F.

    Returns the log file's path. Times increase by one microsecond per record
    from now unless a :class:`LogLine` gives its own.
    """
    path = container_log_path(root, namespace, pod, uid, container, restart)
    path.parent.mkdir(parents=True, exist_ok=True)
    now = _dt.datetime.now(_dt.UTC)
    tick = _dt.timedelta(microseconds=1)
    out: list[str] = []
    for item in lines:
        line = item if isinstance(item, LogLine) else LogLine(item)
        when = line.time or now
        now = max(now, when) + tick
        text = line.text.rstrip("\n")
        chunks = [text[i : i + max_record] for i in range(0, len(text), max_record)] or [""]
        for index, chunk in enumerate(chunks):
            out.append(cri_line(chunk, line.stream, when, partial=index < len(chunks) - 1))
    with path.open("a" if append else "w", encoding="utf-8") as fh:
        fh.writelines(out)
    return path
