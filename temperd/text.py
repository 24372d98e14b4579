"""Text from outside (process and thread names, command lines, what a client sends) made safe to
print or write: every control character escaped, so a name cannot move the cursor, set a
terminal title (OSC), colour or clear the screen, start a new log line or a new TOML line; and
the backslash itself, so a name holding the four characters \\x1b does not read as one holding
ESC."""

from __future__ import annotations

import logging
import re
from typing import Any

# C0 controls (ESC, newline, carriage return, ...), DEL, C1 controls (CSI, OSC as one byte), the
# Unicode line and paragraph separators and the bidirectional overrides and isolates (which
# make text display in an order other than its own). printable() escapes these and the
# backslash, which starts an escape.
CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_UNSAFE = re.compile("[\\\\" + CONTROL.pattern[1:])
# Keeps \t, \n and the backslash: the guard on whole output whose names printable() already
# escaped, where escaping their backslashes again would double them.
_UNSAFE_IN_LINES = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _escape(match: "re.Match[str]") -> str:
    return match.group().encode("unicode_escape").decode("ascii")


def printable(text: object) -> str:
    """str(text) with each unsafe character written as its Python escape (\\x1b, \\n, \\u202e) and
    each backslash as two; text without either comes back unchanged."""
    text = str(text)
    return _UNSAFE.sub(_escape, text) if _UNSAFE.search(text) else text


def printable_again(text: object) -> str:
    """str(text) with each control character escaped and its backslashes kept: for text that
    printable() may already have escaped (a daemon's reply), which escaping again would double."""
    text = str(text)
    return CONTROL.sub(_escape, text) if CONTROL.search(text) else text


def printable_lines(text: str) -> str:
    """printable(), but newlines, tabs and backslashes kept: for whole output whose lines are its
    own and whose names went through printable()."""
    return _UNSAFE_IN_LINES.sub(_escape, text) if _UNSAFE_IN_LINES.search(text) else text


def printable_data(data: Any) -> Any:
    """A JSON-like value with every string in it (keys too) made printable()."""
    if isinstance(data, str):
        return printable(data)
    if isinstance(data, dict):
        return {printable_data(k): printable_data(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [printable_data(v) for v in data]
    return data


class PrintableFormatter(logging.Formatter):
    """Log lines whose message is printable(): a process name, a title or what a client sent
    cannot end the line and forge the next one, nor reach a terminal reading the journal."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = printable(record.message)
        return super().formatMessage(record)
