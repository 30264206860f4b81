"""Make text safe to show a human: no character in it can move a terminal's
cursor, change its colours or title, reorder the line, or start a new line.

Every text that users control (job names, reasons, comments, specs, user
names, error strings quoting them) goes through `printable` before it
reaches a terminal or a plain-text log.
"""

from __future__ import annotations

import re

# C0 controls, DEL, C1 controls, Arabic letter mark, LRM/RLM, line and
# paragraph separators, bidi embeddings/overrides/isolates, lone surrogates;
# and the backslash, so that an escape in the output is never ambiguous.
_UNSAFE = re.compile("[\\\\\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff]")
_SHORT = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(m: re.Match[str]) -> str:
    c = m.group()
    return _SHORT.get(c) or (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")


def printable(text: object, limit: int | None = None) -> str:
    """`str(text)` with the characters above written as visible escapes
    (``\\x1b``, ``\\u202e``, ``\\n``, ``\\\\``); with `limit`, at most that
    many characters of the text, then a ``...(+N chars)`` marker."""
    s = str(text)
    extra = ""
    if limit is not None and len(s) > limit:
        s, extra = s[:limit], f"...(+{len(s) - limit} chars)"
    return _UNSAFE.sub(_escape, s) + extra
