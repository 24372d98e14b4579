"""Tables for people, JSON for scripts."""

from __future__ import annotations

import json
import sys
from typing import Any, Callable, Dict, List, Sequence

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


class ProgressLine:
    """One status line on stderr, rewritten in place on a terminal, a line per note otherwise
    (nothing when quiet): text(note) of each progress note of a request, say() for a stage."""

    def __init__(self, text: Callable[[Dict[str, Any]], str], quiet: bool = False) -> None:
        self.text = text
        self.quiet = quiet
        self.tty = sys.stderr.isatty() and not quiet
        self.shown = False

    def __call__(self, note: Dict[str, Any]) -> None:
        if self.quiet:
            return
        try:
            line = self.text(note)
        except (TypeError, ValueError):
            return  # a note this temperctl cannot read: the request goes on
        click.echo("\r" + line.ljust(70) if self.tty else line, nl=not self.tty, err=True)
        self.shown = True

    def say(self, text: str) -> None:
        if not self.quiet:
            click.echo("\r" + text.ljust(70) if self.tty else text, err=True)
            self.shown = False

    def done(self) -> None:
        """End the line the notes were rewriting (on a terminal)."""
        if self.shown and self.tty:
            click.echo("", err=True)
            self.shown = False


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
