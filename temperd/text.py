"""Text from outside (process and thread names, command lines, what a client sends) made safe to
print or write: every control character escaped, so a name cannot move the cursor, set a
terminal title (OSC), colour or clear the screen, start a new log line or a new TOML line."""

from __future__ import annotations

import re

# C0 controls (ESC, newline, carriage return, ...), DEL, C1 controls (CSI, OSC as one byte), the
# Unicode line and paragraph separators and the bidirectional overrides and isolates (which
# make text display in an order other than its own).
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _escape(match: "re.Match[str]") -> str:
    return match.group().encode("unicode_escape").decode("ascii")


def printable(text: object) -> str:
    """str(text) with each unsafe character written as its Python escape (\\x1b, \\n, \\u202e);
    text without one comes back unchanged."""
    text = str(text)
    return _UNSAFE.sub(_escape, text) if _UNSAFE.search(text) else text
