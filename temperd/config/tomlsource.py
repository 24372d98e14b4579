"""Reading TOML files with enough position information to point a user at the right line.

tomllib does not report where a key was written, so `KeyLines` re-scans the text for table
headers and `key =` lines. It is a locator for error messages, not a parser: values are
always taken from tomllib.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple, Union

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python < 3.11 only
    import tomli as tomllib

from temperd.config.errors import ConfigError, ConfigProblem, KeyPath

_HEADER = re.compile(r"^\s*(\[\[?)\s*([^\]]+?)\s*(\]\]?)\s*(#.*)?$")
_KEY = re.compile(r"""^\s*((?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*')(?:\s*\.\s*(?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*'))*)\s*=""")
_DECODE_POS = re.compile(r"at line (\d+), column (\d+)")


def _split_dotted(key: str) -> Tuple[str, ...]:
    parts = re.findall(r"""[A-Za-z0-9_-]+|"[^"]*"|'[^']*'""", key)
    return tuple(p[1:-1] if p[:1] in "\"'" else p for p in parts)


class KeyLines:
    """Maps key paths such as ("thread_groups", 1, "treatment") to 1-based line numbers."""

    def __init__(self, text: str):
        self._lines: Dict[KeyPath, int] = {}
        array_counts: Dict[Tuple[str, ...], int] = {}
        current: Tuple[Union[str, int], ...] = ()
        in_multiline_array = 0
        for number, line in enumerate(text.splitlines(), start=1):
            if in_multiline_array:
                in_multiline_array += line.count("[") - line.count("]")
                continue
            header = _HEADER.match(line)
            if header and not _KEY.match(line):
                names = _split_dotted(header.group(2))
                if header.group(1) == "[[":
                    array_counts[names] = array_counts.get(names, 0) + 1
                current = self._resolve(names, array_counts)
                self._lines.setdefault(current, number)
                continue
            key = _KEY.match(line)
            if key:
                path = current + _split_dotted(key.group(1))
                self._lines.setdefault(path, number)
                rest = line[key.end():]
                depth = rest.count("[") - rest.count("]")
                if depth > 0:
                    in_multiline_array = depth

    @staticmethod
    def _resolve(names: Tuple[str, ...], array_counts: Dict[Tuple[str, ...], int]) -> Tuple[Union[str, int], ...]:
        path: List[Union[str, int]] = []
        for i, name in enumerate(names):
            path.append(name)
            count = array_counts.get(names[: i + 1])
            if count:
                path.append(count - 1)
        return tuple(path)

    def line_for(self, path: KeyPath) -> Optional[int]:
        """The line of the key, or of its closest enclosing key or table that was written down."""
        path = tuple(path)
        while path:
            if path in self._lines:
                return self._lines[path]
            path = path[:-1]
        return None


@dataclass(frozen=True)
class TomlDocument:
    file: str
    data: dict
    lines: KeyLines

    def problem(self, path: KeyPath, message: str) -> ConfigProblem:
        return ConfigProblem(self.file, tuple(path), message, self.lines.line_for(path))


def parse_toml(text: str, file: str) -> TomlDocument:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        pos = _DECODE_POS.search(message)
        line = int(pos.group(1)) if pos else None
        message = _DECODE_POS.sub("", message).replace("()", "").strip().rstrip(".")
        raise ConfigError([ConfigProblem(file, (), f"not valid TOML: {message}", line)]) from None
    return TomlDocument(file, data, KeyLines(text))


def read_toml(path: str) -> TomlDocument:
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
    except OSError as exc:
        raise ConfigError([ConfigProblem(path, (), f"cannot be read: {exc.strerror}")]) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError([ConfigProblem(path, (), f"not UTF-8 text (byte {exc.start})")]) from None
    return parse_toml(text, path)
