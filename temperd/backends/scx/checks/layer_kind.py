"""A layer's kind: one of Confined, Grouped and Open, and the fields that kind takes (their JSON
types; unknown, renamed, deprecated and other kinds' fields), then their values (cpu_share,
tuning)."""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

from temperd.backends.scx.checks.cpu_share import check_cpu_share
from temperd.backends.scx.checks.problems import WARNING, Findings
from temperd.backends.scx.checks.spec import DEPRECATED_FIELDS, KIND_FIELDS, KINDS, RENAMED_FIELDS
from temperd.backends.scx.checks.tuning import check_tuning
from temperd.backends.scx.checks.value_types import found


def check_kind(findings: Findings, where: str, kind: Any, cpu_count: Optional[int]) -> Tuple[Optional[str], Any]:
    """(kind name, its settings object); None for what cannot be read."""
    path = f"{where} .kind"
    if not isinstance(kind, dict) or len(kind) != 1:
        hint = ""
        if isinstance(kind, str) and kind in KINDS:
            hint = f" (write {{\"{kind}\": {{...}}}})"
        findings.add(path, "kind-shape", "expected an object with exactly one of Confined, Grouped, Open, "
                     + found(kind) + hint)
        return None, None
    name, body = next(iter(kind.items()))
    if name not in KINDS:
        extra = " (Overload was proposed upstream but never shipped; use Grouped with idle_confined)" \
            if name == "Overload" else ""
        findings.add(f"{path}.{name}", "kind-shape", f"expected Confined, Grouped or Open, found {name!r}{extra}")
        return None, None
    kpath = f"{path}.{name}"
    if not isinstance(body, dict):
        findings.add(kpath, "field-type", "expected an object of layer settings, " + found(body))
        return name, None
    check_kind_fields(findings, kpath, name, body)
    check_cpu_share(findings, kpath, name, body, cpu_count)
    check_tuning(findings, kpath, name, body)
    return name, body


def check_kind_fields(findings: Findings, path: str, kind: str, body: Dict[str, Any]) -> None:
    fields = KIND_FIELDS[kind]
    for key, value in body.items():
        fpath = f"{path}.{key}"
        check = fields.get(key) or DEPRECATED_FIELDS.get(key)
        if check is not None:
            problem = check(value)
            if problem:
                findings.add(fpath, "field-type", problem)
            if key not in fields:
                findings.add(fpath, "deprecated-key", f"{key} is deprecated: scx_layered accepts and ignores it", WARNING)
        elif key in RENAMED_FIELDS:
            findings.add(fpath, "renamed-key", f"expected {RENAMED_FIELDS[key]!r}, found the old name {key!r} "
                                               "(scx_layered ignores it silently)")
        else:
            owners = [k for k in KINDS if key in KIND_FIELDS[k]]
            if owners:
                findings.add(fpath, "kind-field", f"{key} is a field of {' and '.join(owners)}, not of {kind} "
                                                  "(scx_layered would ignore it)")
            else:
                findings.add(fpath, "unknown-key", f"expected a known {kind} field, found unknown key {key!r}")
    if kind != "Open" and "util_range" not in body:
        findings.add(path, "required-key", f"expected key 'util_range' ([lo, hi]) on a {kind} layer, found none")
