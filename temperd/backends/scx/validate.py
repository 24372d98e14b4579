"""Validate scx_layered configuration files, more strictly than scx_layered itself.

scx_layered (1.1.x) deserialises its config with serde and then checks a handful of limits
(main.rs verify_layer_specs, Layer::new). It silently ignores unknown keys, so a misspelt or
renamed field (`cpus_pct`, `same_over_idle`, `util_range` under Open) loads without complaint
and the setting is lost. This validator rejects those, applies every startup check the
scheduler makes, and warns about values it accepts but handles surprisingly.

Each finding is a Problem with the place (`layer[2] (web) .kind.Confined.util_range`), a rule
id (`util-range`), a message saying what was expected and what was found, and a severity.

This module reads the file and its JSON; the checks of what the JSON holds are in scx/checks/,
one module per part of a config.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional, Sequence, Tuple

from temperd.backends.scx.checks.problems import RULES, Findings, Problem  # RULES: temperctl lists them from here
from temperd.backends.scx.checks.top_level import ConfigChecker


class _DuplicateKey(ValueError):
    pass


def _no_duplicates(pairs: List[Tuple[str, Any]]) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def validate_text(text: str, *, cpu_count: Optional[int] = None, gpu_support: bool = False) -> List[Problem]:
    """The text read as serde_json reads it (duplicate keys and NaN/Infinity are errors), then checked."""
    try:
        data = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constants)
    except _DuplicateKey as exc:
        return [Problem("(top level)", "duplicate-key", f"key {str(exc)!r} appears twice in one object")]
    except json.JSONDecodeError as exc:
        return [Problem(f"line {exc.lineno} column {exc.colno}", "json-syntax", f"not valid JSON: {exc.msg}")]
    except ValueError as exc:
        return [Problem("(top level)", "json-syntax", f"not valid JSON: {exc}")]
    return validate_config(data, cpu_count=cpu_count, gpu_support=gpu_support)


def validate_file(path: str, *, cpu_count: Optional[int] = None, gpu_support: bool = False) -> List[Problem]:
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except (OSError, UnicodeDecodeError) as exc:
        return [Problem("(file)", "file-read", f"cannot read: {exc}")]
    return validate_text(text, cpu_count=cpu_count, gpu_support=gpu_support)


def validate_config(data: Any, *, cpu_count: Optional[int] = None, gpu_support: bool = False) -> List[Problem]:
    """All problems of one scx_layered config (the parsed JSON), errors and warnings, in the order of the file.

    cpu_count: the host's CPU count, to check cpus_range against; gpu_support: whether
    scx_layered will run with --enable-gpu-support."""
    findings = Findings()
    ConfigChecker(findings, cpu_count, gpu_support).run(data)
    return findings.problems


def errors_of(problems: Sequence[Problem]) -> List[Problem]:
    return [p for p in problems if p.is_error]
