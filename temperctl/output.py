"""Tables for people, JSON for scripts."""

from __future__ import annotations

import json
import sys
from typing import Any, List, Sequence

import click

from temperd.text import printable_again, printable_lines


class PrintableStream:
    """stdout or stderr for people: every control character but newline and tab arrives escaped,
    so no name temperctl prints (a thread's, a title, a unit's) can drive the terminal, piped or
    not. Where a name could hold a newline, the caller escapes it (printable(), tables)."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text):
        return self._stream.write(printable_lines(text) if isinstance(text, str) else text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def guard_output() -> None:
    """Wrap sys.stdout and sys.stderr in PrintableStream (once)."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, PrintableStream):
            setattr(sys, name, PrintableStream(stream))


def print_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=False, default=str))


def print_table(headers: Sequence[str], rows: List[Sequence[Any]]) -> None:
    for line in table(headers, rows):
        click.echo(line)


def table(headers: Sequence[str], rows: List[Sequence[Any]]) -> List[str]:
    """The lines of a table: headers, a rule, the rows, each column as wide as its widest cell."""
    # Cells come escaped by printable() (replies, plan data) or are the project's own text: one
    # more escape would double each backslash.
    cells = [[str(c) for c in headers]] + [["" if c is None else printable_again(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = []
    for n, row in enumerate(cells):
        lines.append("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return lines
