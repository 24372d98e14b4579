"""What the checks find: a Problem per finding, each under a rule of RULES, gathered in Findings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List

from temperd.backends.scx.checks.spec import (GROWTH_ALGOS, MAX_ANDS, MAX_CGROUP_REGEXES, MAX_COMM_BYTES, MAX_HINT,
                                              MAX_LAYERS, MAX_NAME_BYTES, MAX_ORS, MAX_PATH_BYTES, MAX_PERF,
                                              MAX_WEIGHT)

ERROR = "error"
WARNING = "warning"

# Every rule this validator applies: id -> what it checks (the ids appear in every message).
RULES: Dict[str, str] = {
    "file-read": "the file can be read as UTF-8 text",
    "json-syntax": "the file is JSON as serde_json reads it (no NaN/Infinity)",
    "duplicate-key": "no key appears twice in one object (serde rejects duplicate fields)",
    "top-level-array": "the top level is an array of layer specs",
    "layer-count": f"1..{MAX_LAYERS} layers",
    "layer-object": "each layer spec is an object",
    "required-key": "name, matches and kind are present; util_range for Confined and Grouped",
    "unknown-key": "no key scx_layered does not know (it would silently ignore it)",
    "renamed-key": "no old field name (cpus_pct, same_over_idle, ...) that scx_layered now ignores",
    "deprecated-key": "deprecated keys are accepted and ignored (warning)",
    "field-type": "every value has the JSON type the field takes (u64: non-negative integer, f64: number, pair: 2 items)",
    "layer-name": f"names are non-empty ASCII of at most {MAX_NAME_BYTES} bytes",
    "duplicate-name": "layer names are unique",
    "matches-shape": "matches is an array of arrays of match objects",
    "terminal-layer": "the last layer's matches are exactly [[]]",
    "matches-empty": "every layer but the last has at least one OR block",
    "match-all-block": "an empty AND block [] before the last layer matches every task (warning)",
    "or-limit": f"at most {MAX_ORS} OR blocks per layer",
    "and-limit": f"at most {MAX_ANDS} terms per AND block",
    "match-term": "each match term is an object with exactly one key",
    "unknown-match": "the match kind exists",
    "match-value": "each match term's value has the right type",
    "match-length": f"CommPrefix/PcommPrefix(+Exclude)/CmdJoin <= {MAX_COMM_BYTES} bytes, cgroup strings <= {MAX_PATH_BYTES} bytes",
    "cgroup-path": "cgroup strings are relative paths with a trailing '/' where they must match one (warning)",
    "cgroup-regex": f"CgroupRegex compiles; at most {MAX_CGROUP_REGEXES} in a config",
    "avg-runtime": "AvgRuntime [min_us, max_us] has min < max",
    "hint-range": f"HintEquals is 0..{MAX_HINT}",
    "hint-block": "HintEquals stands alone in its AND block except one SystemCpuUtilBelow and one DsqInsertBelow",
    "hint-unique": "a HintEquals value belongs to one layer only",
    "threshold-range": "SystemCpuUtilBelow / DsqInsertBelow are 0.0..1.0",
    "iskthread-value": "IsKthread's value is ignored upstream: false still matches kthreads (warning)",
    "gpu-support": "UsedGpuTid / UsedGpuPid need --enable-gpu-support (warning)",
    "numa-node-spread": "NumaNode matches cannot be combined with NodeSpread* growth",
    "kind-shape": "kind is an object with exactly one of Confined, Grouped, Open",
    "kind-field": "a field of one kind used in another (Grouped-only fields, util_range/cpus_range under Open)",
    "util-range": "util_range is [lo, hi] with 0 <= lo < hi",
    "cpus-range": "cpus_range is [min, max] with min <= max; Confined needs max >= 1",
    "cpus-range-host": "cpus_range max does not exceed the host's CPU count",
    "cpus-range-frac": "cpus_range_frac values are 0.0..1.0 with min <= max",
    "cpus-range-conflict": "cpus_range and cpus_range_frac are not used together",
    "peak-half-life-open": "util_peak_half_life_ms is 0 on Open layers",
    "growth-algo": "growth_algo is one of " + ", ".join(GROWTH_ALGOS),
    "growth-algo-risky": "StickyDynamic has an open starvation report upstream (warning)",
    "placement": "placement is Standard, Sticky or Floating",
    "weight-range": f"weight is 1..{MAX_WEIGHT} (0 means the default 100; larger values are clamped)",
    "perf-range": f"perf is 0 (unset) or 1..{MAX_PERF}",
    "yield-ignore-range": "yield_ignore is 0.0..1.0",
    "node-ids": "nodes / llcs list each ID once",
    "xnuma-threshold": "xnuma_threshold(_delta) pairs have lo <= hi (warning)",
    "preempt-overrides": "disallow_*_after_us is ignored when preempt is true (warning)",
    "open-weight": "weight on an Open layer does nothing: it only divides CPUs among Confined/Grouped layers (warning)",
    "preempt-first-alone": "preempt_first does nothing without preempt (warning)",
    "membw": "membw_gb panics scx_layered on CPU models it does not know (warning)",
    "template-type": "template is one CgroupSuffix or CgroupRegex match object",
    "template-startup": "templates are expanded once at startup; later cgroups get no layer (warning)",
}


@dataclass(frozen=True)
class Problem:
    path: str  # where: "layer[2] (web) .kind.Confined.util_range"; "(top level)" for the file
    rule: str  # an id from RULES
    message: str  # "expected ..., found ..."
    severity: str = ERROR

    @property
    def is_error(self) -> bool:
        return self.severity == ERROR

    def line(self, source: str) -> str:
        """One line for a terminal: `FILE: PATH: [warning: ]MESSAGE [rule]`."""
        level = "warning: " if self.severity == WARNING else ""
        return f"{source}: {self.path}: {level}{self.message} [{self.rule}]"


class Findings:
    """The problems of one config, in the order the checks find them; every checker adds here."""

    def __init__(self) -> None:
        self.problems: List[Problem] = []

    def add(self, path: str, rule: str, message: str, severity: str = ERROR) -> None:
        assert rule in RULES, rule
        self.problems.append(Problem(path, rule, message, severity))
