"""How a setting's default is declared (once, in its Spec) and shown: a default that depends on
another key of the same table (a thread group's weight on its treatment), and the TOML text of a
default that the schema's help text, the man pages' tables and the tests read."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Iterator, Mapping, Tuple


@dataclass(frozen=True)
class ByValue:
    """A default that depends on the value of another key of the same table (`key`)."""

    key: str
    values: Tuple[Tuple[Any, Any], ...]

    def of(self, value: Any) -> Any:
        """The default where `key` holds `value`; None where that value has none (a bad one)."""
        return dict(self.values).get(value)


def by_value(key: str, defaults: Mapping[Any, Any]) -> ByValue:
    return ByValue(key, tuple(defaults.items()))


def resolve(default: Any, values: Dict[str, Any]) -> Any:
    """A declared default as it applies to a table whose checked values are `values`."""
    return default.of(values.get(default.key)) if isinstance(default, ByValue) else default


def toml_text(value: Any) -> str:
    """A value as TOML writes it: true, 30.0, "auto", ["a", "b"]."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_text(v) for v in value) + "]"
    return repr(value)


def default_text(default: Any) -> str:
    """A declared default as people read it: its TOML value, or each value's for a ByValue."""
    if isinstance(default, ByValue):
        return ", ".join(f"{value} {toml_text(d)}" for value, d in default.values)
    return toml_text(default)


def shown(spec: Any) -> bool:
    """Whether a key has a default worth saying: a scalar or a list (a table's are its keys')."""
    return spec.default is not None and spec.type not in ("table", "tables")


def toml_listing(table: Any, header: str = "") -> Iterator[str]:
    """Every default of a TableSpec as temperd.toml or a profile would spell it, a table's under its
    [header] ([[header]] for an array of tables); a ByValue's as `key = by KEY: ...`."""
    own = [(key, spec) for key, spec in table.fields.items() if shown(spec)]
    if header and own:
        yield header
    for key, spec in own:
        text = default_text(spec.default)
        yield f"{key} = by {spec.default.key}: {text}" if isinstance(spec.default, ByValue) else f"{key} = {text}"
    for key, spec in table.fields.items():
        if spec.table is not None:
            name = f"{header.strip('[]')}.{key}" if header else key
            yield from toml_listing(spec.table, f"[[{name}]]" if spec.type == "tables" else f"[{name}]")


def roff_literal(lines: Iterator[str]) -> Iterator[str]:
    """Text lines for a man page's no-fill block: backslashes and minus signs escaped, none read as a request."""
    for line in lines:
        line = line.replace("\\", "\\e").replace("-", "\\-")
        yield "\\&" + line if line.startswith((".", "'")) else line


MAN_BEGIN = '.\\" Defaults: written from the specs by scripts/man-defaults.py; do not edit by hand.'
MAN_END = '.\\" End of defaults.'


def in_man_page(page: str, table: Any) -> str:
    """A man page's text with its defaults block (between MAN_BEGIN and MAN_END) written from `table`."""
    head, rest = page.split(MAN_BEGIN + "\n", 1)
    _, tail = rest.split(MAN_END + "\n", 1)
    block = [MAN_BEGIN, ".PP", ".nf", *roff_literal(toml_listing(table)), ".fi", MAN_END]
    return head + "\n".join(block) + "\n" + tail
