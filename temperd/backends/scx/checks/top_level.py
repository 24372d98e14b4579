"""A whole scx_layered config: the top-level array of layer specs, and each layer's own keys (name,
comment, template); its kind and its matches go to their own checkers."""

from __future__ import annotations

from typing import Any, Dict, Optional

from temperd.backends.scx.checks.layer_kind import check_kind
from temperd.backends.scx.checks.matches import MatchChecker
from temperd.backends.scx.checks.problems import WARNING, Findings
from temperd.backends.scx.checks.spec import LAYER_KEYS, MAX_CGROUP_REGEXES, MAX_LAYERS, MAX_NAME_BYTES, TEMPLATE_MATCHES
from temperd.backends.scx.checks.value_types import found, optional, show, string


class ConfigChecker:
    def __init__(self, findings: Findings, cpu_count: Optional[int], gpu_support: bool):
        self.findings = findings
        self.cpu_count = cpu_count
        self.matches = MatchChecker(findings, gpu_support)

    def run(self, data: Any) -> None:
        add = self.findings.add
        if not isinstance(data, list):
            add("(top level)", "top-level-array", "expected a JSON array of layer specs, " + found(data)
                + (" (scx_layered takes the array itself, not an object holding it)" if isinstance(data, dict) else ""))
            return
        if not 1 <= len(data) <= MAX_LAYERS:
            add("(top level)", "layer-count", f"expected 1..{MAX_LAYERS} layers, found {len(data)}")
        names: Dict[str, int] = {}
        for index, layer in enumerate(data):
            self.layer(index, layer, index == len(data) - 1, names)
        if self.matches.regexes > MAX_CGROUP_REGEXES:
            add("(top level)", "cgroup-regex",
                f"expected at most {MAX_CGROUP_REGEXES} CgroupRegex matches in one config, found {self.matches.regexes}")

    def layer(self, index: int, layer: Any, last: bool, names: Dict[str, int]) -> None:
        add = self.findings.add
        where = f"layer[{index}]"
        if not isinstance(layer, dict):
            add(where, "layer-object", "expected a layer spec object, " + found(layer))
            return
        name = layer.get("name")
        if isinstance(name, str):
            where = f"layer[{index}] ({name})"
        for key in layer:
            if key not in LAYER_KEYS:
                extra = " (cpuset cannot be set from JSON)" if key == "cpuset" else ""
                add(f"{where} .{key}", "unknown-key",
                    f"expected one of {', '.join(LAYER_KEYS)}, found unknown key {key!r}{extra}")
        for key in ("name", "matches", "kind"):
            if key not in layer:
                add(where, "required-key", f"expected key {key!r}, found none")
        if "name" in layer:
            self.name(where, index, layer["name"], names)
        if "comment" in layer:
            problem = optional(string)(layer["comment"])
            if problem:
                add(f"{where} .comment", "field-type", problem)
        if layer.get("template") is not None:
            self.template(where, layer["template"])
        body = check_kind(self.findings, where, layer["kind"], self.cpu_count)[1] if "kind" in layer else None
        if "matches" in layer:
            self.matches.check(where, index, layer["matches"], last, body)

    def name(self, where: str, index: int, name: Any, names: Dict[str, int]) -> None:
        add = self.findings.add
        if not isinstance(name, str):
            add(f"{where} .name", "field-type", "expected a string, " + found(name))
            return
        raw = name.encode("utf-8")
        if not name or not name.isascii() or len(raw) > MAX_NAME_BYTES or not name.isprintable():
            add(f"{where} .name", "layer-name",
                f"expected printable ASCII of 1..{MAX_NAME_BYTES} bytes, found {show(name)} ({len(raw)} bytes)")
        if name in names:
            add(f"{where} .name", "duplicate-name",
                f"expected a unique name (stats are keyed by name), found {show(name)} again (first at layer[{names[name]}])")
        else:
            names[name] = index

    def template(self, where: str, template: Any) -> None:
        """One CgroupSuffix or CgroupRegex match object, checked as a match term first."""
        path = f"{where} .template"
        kind = self.matches.term(path, template)
        if kind is None:
            return
        if kind not in TEMPLATE_MATCHES:
            self.findings.add(path, "template-type", f"expected a CgroupSuffix or CgroupRegex match, found {kind} "
                                                     "(scx_layered panics on any other template type)")
            return
        self.findings.add(path, "template-startup",
                          "the template is expanded once at startup by walking /sys/fs/cgroup; "
                          "cgroups created later get no layer, and the layer count after expansion "
                          f"must still be <= {MAX_LAYERS}", WARNING)
