"""Configuration problems that name the file, the key, the line, what was found and what was expected."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple, Union

KeyPath = Tuple[Union[str, int], ...]


@dataclass(frozen=True)
class ConfigProblem:
    file: str
    keypath: KeyPath
    message: str  # "expected ..., found ..." or a sentence saying what is wrong
    line: Optional[int] = None

    @property
    def key(self) -> str:
        """The key path as written: thread_groups[1].treatment."""
        out = ""
        for part in self.keypath:
            if isinstance(part, int):
                out += f"[{part}]"
            else:
                out += ("." if out else "") + part
        return out or "(top level)"

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        return f"{where}: {self.key}: {self.message}"

    def as_dict(self) -> dict:
        return {"file": self.file, "line": self.line, "key": self.key, "message": self.message}


class ConfigError(Exception):
    """One or more problems with a configuration or profile file."""

    def __init__(self, problems: Sequence[ConfigProblem]):
        self.problems: List[ConfigProblem] = list(problems)
        super().__init__("\n".join(str(p) for p in self.problems))


def describe_value(value: object) -> str:
    """How a found value is shown in a message: TOML-ish, short."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return repr(value if len(value) <= 60 else value[:57] + "...")
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return f"an array of {len(value)}"
    return repr(value)
