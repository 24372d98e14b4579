"""Declarative field specs: one description of a TOML format drives both strict validation
and the JSON Schema handed to editors, so the two cannot disagree."""

from __future__ import annotations

import fnmatch
import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

from temperd.config.defaults import ByValue, default_text, resolve, shown
from temperd.config.errors import ConfigProblem, KeyPath, describe_value
from temperd.config.tomlsource import TomlDocument

# A value checker returns None when fine, else what was expected (used as "expected <...>").
ItemCheck = Callable[[str], Optional[str]]

COMM_MAX_BYTES = 15  # the kernel's TASK_COMM_LEN - 1


@dataclass(frozen=True)
class Spec:
    """One key: its TOML type, constraints and documentation."""

    type: str  # "int" | "float" | "str" | "bool" | "strlist" | "table" | "tables"
    doc: str
    required: bool = False
    default: Any = None  # the one declaration of the key's default: a value, or a ByValue
    choices: Tuple[Any, ...] = ()
    minimum: Optional[float] = None
    maximum: Optional[float] = None
    exclusive_minimum: bool = False
    pattern: Optional[str] = None  # regex a str (or each strlist item) must fully match
    pattern_doc: str = ""  # how `pattern` is described to people
    item_check: Optional[ItemCheck] = None  # extra check for each str / strlist item
    item_format: str = ""  # JSON Schema "format"-like hint for docs
    table: Optional["TableSpec"] = None  # for "table" and "tables"
    min_items: int = 0


@dataclass(frozen=True)
class TableSpec:
    title: str
    doc: str
    fields: Dict[str, Spec] = field(default_factory=dict)

    def default_of(self, key: str) -> Any:
        """The one declared default of a key; the typed dataclasses take theirs from here."""
        return self.fields[key].default

    def default_for(self, key: str, values: Dict[str, Any]) -> Any:
        """A key's default in a table holding `values` (a ByValue's is the one for its key's value)."""
        return resolve(self.fields[key].default, values)


# Each TOML type a key may take: its check, and how it is named to people.
_TYPES: Dict[str, Tuple[Callable[[Any], bool], str]] = {
    "int": (lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
    "float": (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool), "a number"),
    "str": (lambda v: isinstance(v, str), "a string"),
    "bool": (lambda v: isinstance(v, bool), "true or false"),
    "strlist": (lambda v: isinstance(v, list), "an array of strings"),
    "table": (lambda v: isinstance(v, dict), "a table"),
    "tables": (lambda v: isinstance(v, list) and all(isinstance(item, dict) for item in v), "an array of tables"),
}


def _range_text(spec: Spec) -> str:
    low, high = spec.minimum, spec.maximum
    if low is not None and high is not None:
        op = "<" if spec.exclusive_minimum else "<="
        return f"a value with {low:g} {op} value <= {high:g}"
    if low is not None:
        return f"a value {'>' if spec.exclusive_minimum else '>='} {low:g}"
    return f"a value <= {high:g}"


class Validator:
    """Walks a TOML document against TableSpecs, collecting every problem (not just the first)."""

    def __init__(self, doc: TomlDocument):
        self.doc = doc
        self.problems: List[ConfigProblem] = []

    def fail(self, path: KeyPath, message: str) -> None:
        self.problems.append(self.doc.problem(path, message))

    def table(self, data: dict, spec: TableSpec, path: KeyPath = ()) -> Dict[str, Any]:
        """Checked values of one table, with defaults filled in; bad keys are reported and skipped."""
        out: Dict[str, Any] = {}
        for key in data:
            if key not in spec.fields:
                known = ", ".join(sorted(spec.fields))
                self.fail(path + (key,), f"unknown key; expected one of: {known}")
        for key, fspec in spec.fields.items():
            if key not in data:
                if fspec.required:
                    self.fail(path + (key,), f"missing required key; expected {self._expect(fspec)}")
                # An absent table still yields its keys' defaults, so no reader needs its own.
                out[key] = self.table({}, fspec.table, path + (key,)) if fspec.type == "table" else fspec.default
                continue
            out[key] = self.value(data[key], fspec, path + (key,))
        # A default that depends on another key's value is the one for that key's checked value.
        return {key: resolve(value, out) for key, value in out.items()}

    def value(self, value: Any, spec: Spec, path: KeyPath) -> Any:
        type_ok, type_name = _TYPES[spec.type]
        if not type_ok(value):
            self.fail(path, f"expected {type_name}, found {describe_value(value)}")
            return spec.default
        if spec.type == "table":
            assert spec.table is not None
            return self.table(value, spec.table, path)
        if spec.type == "tables":
            assert spec.table is not None
            if len(value) < spec.min_items:
                self.fail(path, f"expected at least {spec.min_items} [[{path[-1]}]] table(s), found {len(value)}")
            return [self.table(item, spec.table, path + (i,)) for i, item in enumerate(value)]
        if spec.type == "strlist":
            good = []
            for i, item in enumerate(value):
                if not isinstance(item, str):
                    self.fail(path + (i,), f"expected a string, found {describe_value(item)}")
                elif self._scalar_ok(item, spec, path + (i,)):
                    good.append(item)
            if len(value) < spec.min_items:
                self.fail(path, f"expected at least {spec.min_items} item(s), found none")
            return tuple(good)
        if not self._scalar_ok(value, spec, path):
            return spec.default
        if spec.type == "float":
            return float(value)
        return value

    def _scalar_ok(self, value: Any, spec: Spec, path: KeyPath) -> bool:
        if isinstance(value, float) and not math.isfinite(value):
            # TOML has nan and inf; no setting means either, and nan passes every comparison
            self.fail(path, f"expected a finite number, found {describe_value(value)}")
            return False
        if spec.choices and value not in spec.choices:
            self.fail(path, f"expected {self._expect(spec)}, found {describe_value(value)}")
            return False
        if spec.minimum is not None or spec.maximum is not None:
            too_low = spec.minimum is not None and (
                value <= spec.minimum if spec.exclusive_minimum else value < spec.minimum
            )
            too_high = spec.maximum is not None and value > spec.maximum
            if too_low or too_high:
                self.fail(path, f"expected {_range_text(spec)}, found {describe_value(value)}")
                return False
        if spec.pattern is not None and not re.fullmatch(spec.pattern, value):
            self.fail(path, f"expected {spec.pattern_doc or 'text matching ' + spec.pattern}, found {describe_value(value)}")
            return False
        if spec.item_check is not None:
            expected = spec.item_check(value)
            if expected:
                self.fail(path, f"expected {expected}, found {describe_value(value)}")
                return False
        return True

    @staticmethod
    def _expect(spec: Spec) -> str:
        if spec.choices:
            return "one of " + ", ".join(describe_value(c) for c in spec.choices)
        return _TYPES[spec.type][1]


# ---- pattern checks shared by profiles and the daemon configuration ----------------------------


def check_glob(pattern: str) -> Optional[str]:
    if not pattern:
        return "a non-empty glob pattern"
    depth = 0
    for ch in pattern:
        if ch == "[":
            depth += 1
        elif ch == "]" and depth:
            depth -= 1
    if depth:
        return "a glob pattern with balanced [ ]"
    return None


def check_comm_glob(pattern: str) -> Optional[str]:
    """Thread names are at most 15 bytes: a pattern needing more can never match."""
    problem = check_glob(pattern)
    if problem:
        return problem
    literal = re.sub(r"\[[^\]]*\]", "?", pattern).replace("*", "")
    if len(literal.encode()) > COMM_MAX_BYTES:
        return f"a thread-name glob that can match a name of at most {COMM_MAX_BYTES} bytes (the kernel truncates thread names)"
    return None


def check_cgroup_path(path: str) -> Optional[str]:
    if not path.startswith("/"):
        return "an absolute cgroup path starting with '/'"
    return None


def glob_match(pattern: str, text: str) -> bool:
    return fnmatch.fnmatchcase(text, pattern)


# ---- JSON Schema ----------------------------------------------------------------------------------


def json_schema(spec: TableSpec, *, root_id: Optional[str] = None) -> dict:
    schema = _table_schema(spec)
    if root_id:
        schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": root_id, **schema}
    return schema


def _table_schema(spec: TableSpec) -> dict:
    return {
        "title": spec.title,
        "description": spec.doc,
        "type": "object",
        "additionalProperties": False,
        "required": sorted(k for k, f in spec.fields.items() if f.required),
        "properties": {k: _field_schema(f) for k, f in spec.fields.items()},
    }


def _field_schema(spec: Spec) -> dict:
    # The help text says the declared default; no doc types it in.
    out: Dict[str, Any] = {"description": spec.doc + (f" Default: {default_text(spec.default)}." if shown(spec) else "")}
    scalar: Dict[str, Any] = {}
    kind = spec.type
    if kind in ("int", "float", "str", "bool"):
        scalar["type"] = {"int": "integer", "float": "number", "str": "string", "bool": "boolean"}[kind]
    if spec.choices:
        scalar["enum"] = list(spec.choices)
    if spec.minimum is not None:
        scalar["exclusiveMinimum" if spec.exclusive_minimum else "minimum"] = spec.minimum
    if spec.maximum is not None:
        scalar["maximum"] = spec.maximum
    if spec.pattern is not None:
        scalar["pattern"] = f"^(?:{spec.pattern})$"
    if spec.item_format:
        scalar["x-temper-format"] = spec.item_format
    if kind == "strlist":
        out.update({"type": "array", "items": {"type": "string", **scalar}})
    elif kind == "table":
        assert spec.table is not None
        out.update(_table_schema(spec.table))
        out["description"] = spec.doc
    elif kind == "tables":
        assert spec.table is not None
        out.update({"type": "array", "items": _table_schema(spec.table)})
    else:
        out.update(scalar)
    if spec.min_items:  # strlist and tables
        out["minItems"] = spec.min_items
    if spec.default is not None and not isinstance(spec.default, ByValue):
        out["default"] = list(spec.default) if isinstance(spec.default, tuple) else spec.default
    return out
