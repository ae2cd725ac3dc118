"""Names from the outside world, made safe to print and to put in JSON.

File and folder names are bytes chosen by whoever wrote them: they may hold
ANSI escape sequences (which would recolour or rewrite the user's terminal),
other control characters, bidirectional overrides, or bytes that are not UTF-8
(which Python carries as lone surrogates, invalid in UTF-8 output and in JSON).
:func:`printable` is applied wherever kcover shows such a name — warnings,
tables, evidence sources, node names taken from folder names — and writes each
offending character as a visible escape: an undecodable byte as ``\\xff``, a
control character as ``\\x1b``, other invisible controls as ``\\u202e``.  The
same text is used in human output and in ``--json``, so the two always agree.
:func:`json_text` is the last guard of every JSON document kcover prints: any
string still holding a lone surrogate is escaped the same way, so the output is
always valid UTF-8.
"""

from __future__ import annotations

import json
import re
from typing import Any

# C0 and C1 controls, DEL, line/paragraph separators, bidi embeddings/overrides/isolates, surrogates.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    if 0xDC80 <= code <= 0xDCFF:  # a byte that was not UTF-8 (surrogateescape)
        return f"\\x{code - 0xDC00:02x}"
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def printable(text: str) -> str:
    """``text`` with control characters, bidi controls and undecodable bytes written as visible escapes."""
    return _UNSAFE.sub(_escape, text)


_SURROGATE = re.compile("[\ud800-\udfff]")


def _valid_utf8(value: Any) -> Any:
    if isinstance(value, str):
        return _SURROGATE.sub(_escape, value)
    if isinstance(value, dict):
        return {_valid_utf8(key): _valid_utf8(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_valid_utf8(item) for item in value]
    return value


def json_text(document: Any) -> str:
    """``document`` as indented JSON that is valid UTF-8 whatever bytes its strings came from."""
    return json.dumps(_valid_utf8(document), indent=2)
