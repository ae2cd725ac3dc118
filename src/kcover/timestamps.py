"""Times as Kubernetes and our records write them: RFC 3339 in UTC, and back.

One formatter for every timestamp kcover writes on an object (annotations,
Events, Leases): ``seconds`` for annotations people read, ``microseconds``
where the API server expects a MicroTime (a Lease's ``renewTime``, an Event's
``eventTime``).  :func:`parse_rfc3339` is forgiving: anything that is not such
a time is ``None``, never an exception, because annotations are written by
people too.
"""

from __future__ import annotations

import datetime as dt
from typing import Literal

Precision = Literal["seconds", "milliseconds", "microseconds"]


def rfc3339(moment: dt.datetime, timespec: Precision = "seconds") -> str:
    """``2026-12-01T11:00:00Z`` (or with a fraction of a second); naive times are taken as UTC."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return moment.astimezone(dt.UTC).isoformat(timespec=timespec).replace("+00:00", "Z")


def parse_rfc3339(text: object) -> dt.datetime | None:
    """The aware time in ``text``, or ``None`` for anything that is not one."""
    if not isinstance(text, str) or not text:
        return None
    try:
        moment = dt.datetime.fromisoformat(text)
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=dt.UTC)
