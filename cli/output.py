"""Tables for people, JSON for scripts."""

from __future__ import annotations

import json
from typing import Any, List, Sequence

import click


def print_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=False, default=str))


def print_table(headers: Sequence[str], rows: List[Sequence[Any]]) -> None:
    cells = [[str(c) for c in headers]] + [["" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    for n, row in enumerate(cells):
        line = "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip()
        click.echo(line)
        if n == 0:
            click.echo("  ".join("-" * w for w in widths))
