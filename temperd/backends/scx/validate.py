"""Validate scx_layered configuration files, more strictly than scx_layered itself.

scx_layered (1.1.x) deserialises its config with serde and then checks a handful of limits
(main.rs verify_layer_specs, Layer::new). It silently ignores unknown keys, so a misspelt or
renamed field (`cpus_pct`, `same_over_idle`, `util_range` under Open) loads without complaint
and the setting is lost. This validator rejects those, applies every startup check the
scheduler makes, and warns about values it accepts but handles surprisingly.

Each finding is a Problem with the place (`layer[2] (web) .kind.Confined.util_range`), a rule
id (`util-range`), a message saying what was expected and what was found, and a severity.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

ERROR = "error"
WARNING = "warning"

MAX_LAYERS = 16
MAX_ORS = 32
MAX_ANDS = 26  # one per match kind (intf.h NR_LAYER_MATCH_KINDS)
MAX_NAME_BYTES = 63  # 64 bytes for the name, 64 for a template suffix, NUL included (intf.h)
MAX_COMM_BYTES = 15  # TASK_COMM_LEN 16 with the NUL
MAX_PATH_BYTES = 4095
MAX_CGROUP_REGEXES = 16
MAX_HINT = 1024
MAX_WEIGHT = 10000
MAX_PERF = 1024

U32_MAX = 2 ** 32 - 1
U64_MAX = 2 ** 64 - 1
I32_MIN, I32_MAX = -(2 ** 31), 2 ** 31 - 1

GROWTH_ALGOS = ("Sticky", "Linear", "Reverse", "Random", "Topo", "RoundRobin", "BigLittle", "LittleBig",
                "NodeSpread", "NodeSpreadReverse", "NodeSpreadRandom", "CpuSetSpread", "CpuSetSpreadReverse",
                "CpuSetSpreadRandom", "RandomTopo", "StickyDynamic")
NODE_SPREAD_ALGOS = ("NodeSpread", "NodeSpreadReverse", "NodeSpreadRandom")
PLACEMENTS = ("Standard", "Sticky", "Floating")
KINDS = ("Confined", "Grouped", "Open")

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


# ---- value types ---------------------------------------------------------------------------------

def _show(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (_is_int(value) or isinstance(value, float)) and not isinstance(value, bool)


def _found(value: Any) -> str:
    if isinstance(value, bool):
        return f"found {_show(value)} (a boolean)"
    if isinstance(value, float):
        return f"found {_show(value)} (a number with a fraction or exponent)"
    if _is_int(value):
        return f"found {value}"
    if isinstance(value, str):
        return f"found {_show(value)} (a string)"
    if value is None:
        return "found null"
    if isinstance(value, list):
        return f"found {_show(value)} (an array of {len(value)})"
    return f"found {_show(value)} (an object)"


TypeCheck = Callable[[Any], Optional[str]]  # None when the value fits, else "expected ..., found ..."


def _unsigned(bits: int) -> TypeCheck:
    top = 2 ** bits - 1

    def check(value: Any) -> Optional[str]:
        if _is_int(value) and 0 <= value <= top:
            return None
        return f"expected an unsigned {bits}-bit integer (0..{top}, no fraction), {_found(value)}"
    return check


def _i32(value: Any) -> Optional[str]:
    if _is_int(value) and I32_MIN <= value <= I32_MAX:
        return None
    return f"expected a 32-bit signed integer, {_found(value)}"


def _f64(value: Any) -> Optional[str]:
    if _is_number(value) and math.isfinite(value):
        return None
    return f"expected a number, {_found(value)}"


def _bool(value: Any) -> Optional[str]:
    return None if isinstance(value, bool) else f"expected true or false, {_found(value)}"


def _string(value: Any) -> Optional[str]:
    return None if isinstance(value, str) else f"expected a string, {_found(value)}"


def _optional(inner: TypeCheck) -> TypeCheck:
    def check(value: Any) -> Optional[str]:
        if value is None:
            return None
        problem = inner(value)
        return problem and problem.replace("expected ", "expected null or ", 1)
    return check


def _pair(first: TypeCheck, second: TypeCheck, what: str) -> TypeCheck:
    def check(value: Any) -> Optional[str]:
        if not isinstance(value, list) or len(value) != 2 or first(value[0]) or second(value[1]):
            return f"expected a 2-element array [{what}], {_found(value)}"
        return None
    return check


def _vec(inner: TypeCheck, what: str) -> TypeCheck:
    def check(value: Any) -> Optional[str]:
        if not isinstance(value, list) or any(inner(item) for item in value):
            return f"expected an array of {what}, {_found(value)}"
        return None
    return check


_u32 = _unsigned(32)
_u64 = _unsigned(64)
_usize = _u64

COMMON_FIELDS: Dict[str, TypeCheck] = {
    "min_exec_us": _u64,
    "yield_ignore": _f64,
    "slice_us": _u64,
    "fifo": _bool,
    "preempt": _bool,
    "preempt_first": _bool,
    "exclusive": _bool,
    "skip_remote_node": _bool,
    "prev_over_idle_core": _bool,
    "weight": _u32,
    "disallow_open_after_us": _optional(_u64),
    "disallow_preempt_after_us": _optional(_u64),
    "xllc_mig_min_us": _f64,
    "growth_algo": _string,
    "util_peak_half_life_ms": _u64,
    "perf": _u64,
    "idle_resume_us": _optional(_u32),
    "nodes": _vec(_usize, "non-negative integers"),
    "llcs": _vec(_usize, "non-negative integers"),
    "placement": _string,
    "member_expire_ms": _u64,
    "xnuma_threshold": _pair(_f64, _f64, "number, number"),
    "xnuma_threshold_delta": _pair(_f64, _f64, "number, number"),
}
DEPRECATED_FIELDS: Dict[str, TypeCheck] = {"idle_smt": _optional(_bool), "allow_node_aligned": _optional(_bool)}
OWNING_FIELDS: Dict[str, TypeCheck] = {  # Confined and Grouped
    "util_range": _pair(_f64, _f64, "lo, hi"),
    "cpus_range": _optional(_pair(_usize, _usize, "min, max")),
    "cpus_range_frac": _optional(_pair(_f64, _f64, "min fraction, max fraction")),
    "membw_gb": _optional(_f64),
    "protected": _bool,
}
GROUPED_ONLY_FIELDS: Dict[str, TypeCheck] = {"util_includes_open_cputime": _bool, "idle_confined": _bool}
KIND_FIELDS: Dict[str, Dict[str, TypeCheck]] = {
    "Confined": {**OWNING_FIELDS, **COMMON_FIELDS},
    "Grouped": {**OWNING_FIELDS, **GROUPED_ONLY_FIELDS, **COMMON_FIELDS},
    "Open": dict(COMMON_FIELDS),
}
RENAMED_FIELDS = {"cpus_pct": "cpus_range_frac", "cpus_range_pct": "cpus_range_frac",
                  "same_over_idle": "prev_over_idle_core"}
LAYER_KEYS = ("name", "comment", "template", "matches", "kind")

_STRING_LIMITS = {"CgroupPrefix": MAX_PATH_BYTES, "CgroupSuffix": MAX_PATH_BYTES, "CgroupContains": MAX_PATH_BYTES,
                  "CommPrefix": MAX_COMM_BYTES, "CommPrefixExclude": MAX_COMM_BYTES, "PcommPrefix": MAX_COMM_BYTES,
                  "PcommPrefixExclude": MAX_COMM_BYTES, "CmdJoin": MAX_COMM_BYTES}
MATCH_VALUES: Dict[str, TypeCheck] = {
    **{kind: _string for kind in _STRING_LIMITS},
    "CgroupRegex": _string,
    "NiceAbove": _i32, "NiceBelow": _i32, "NiceEquals": _i32,
    "UIDEquals": _u32, "GIDEquals": _u32, "PIDEquals": _u32, "PPIDEquals": _u32, "TGIDEquals": _u32,
    "NSPIDEquals": _pair(_u64, _u32, "pid-namespace inode, pid"),
    "NSEquals": _u32,
    "IsGroupLeader": _bool, "IsKthread": _bool, "UsedGpuTid": _bool, "UsedGpuPid": _bool,
    "AvgRuntime": _pair(_u64, _u64, "min_us, max_us"),
    "HintEquals": _u64,
    "SystemCpuUtilBelow": _f64, "DsqInsertBelow": _f64,
    "NumaNode": _u32,
}
TEMPLATE_MATCHES = ("CgroupSuffix", "CgroupRegex")


# ---- parsing ---------------------------------------------------------------------------------------

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


def parse_text(text: str) -> Tuple[Any, List[Problem]]:
    """JSON as serde_json reads it: duplicate keys and NaN/Infinity are errors."""
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constants), []
    except _DuplicateKey as exc:
        return None, [Problem("(top level)", "duplicate-key", f"key {str(exc)!r} appears twice in one object")]
    except json.JSONDecodeError as exc:
        return None, [Problem(f"line {exc.lineno} column {exc.colno}", "json-syntax", f"not valid JSON: {exc.msg}")]
    except ValueError as exc:
        return None, [Problem("(top level)", "json-syntax", f"not valid JSON: {exc}")]


def validate_text(text: str, *, cpu_count: Optional[int] = None, gpu_support: bool = False) -> List[Problem]:
    data, problems = parse_text(text)
    if problems:
        return problems
    return validate_config(data, cpu_count=cpu_count, gpu_support=gpu_support)


def validate_file(path: str, *, cpu_count: Optional[int] = None, gpu_support: bool = False) -> List[Problem]:
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except (OSError, UnicodeDecodeError) as exc:
        return [Problem("(file)", "file-read", f"cannot read: {exc}")]
    return validate_text(text, cpu_count=cpu_count, gpu_support=gpu_support)


def validate_config(data: Any, *, cpu_count: Optional[int] = None, gpu_support: bool = False) -> List[Problem]:
    """All problems of one scx_layered config (the parsed JSON), errors and warnings.

    cpu_count: the host's CPU count, to check cpus_range against; gpu_support: whether
    scx_layered will run with --enable-gpu-support."""
    return _Checker(cpu_count, gpu_support).run(data)


def errors_of(problems: Sequence[Problem]) -> List[Problem]:
    return [p for p in problems if p.is_error]


# ---- the checks ------------------------------------------------------------------------------------

class _Checker:
    def __init__(self, cpu_count: Optional[int], gpu_support: bool):
        self.cpu_count = cpu_count
        self.gpu_support = gpu_support
        self.problems: List[Problem] = []
        self.hints: Dict[int, int] = {}  # HintEquals value -> layer index
        self.regexes = 0

    def add(self, path: str, rule: str, message: str, severity: str = ERROR) -> None:
        assert rule in RULES, rule
        self.problems.append(Problem(path, rule, message, severity))

    def run(self, data: Any) -> List[Problem]:
        if not isinstance(data, list):
            self.add("(top level)", "top-level-array",
                     "expected a JSON array of layer specs, " + _found(data)
                     + (" (scx_layered takes the array itself, not an object holding it)" if isinstance(data, dict) else ""))
            return self.problems
        if not 1 <= len(data) <= MAX_LAYERS:
            self.add("(top level)", "layer-count", f"expected 1..{MAX_LAYERS} layers, found {len(data)}")
        names: Dict[str, int] = {}
        for index, layer in enumerate(data):
            self.layer(index, layer, index == len(data) - 1, names)
        if self.regexes > MAX_CGROUP_REGEXES:
            self.add("(top level)", "cgroup-regex",
                     f"expected at most {MAX_CGROUP_REGEXES} CgroupRegex matches in one config, found {self.regexes}")
        return self.problems

    def layer(self, index: int, layer: Any, last: bool, names: Dict[str, int]) -> None:
        where = f"layer[{index}]"
        if not isinstance(layer, dict):
            self.add(where, "layer-object", "expected a layer spec object, " + _found(layer))
            return
        name = layer.get("name")
        if isinstance(name, str):
            where = f"layer[{index}] ({name})"
        for key in layer:
            if key not in LAYER_KEYS:
                extra = " (cpuset cannot be set from JSON)" if key == "cpuset" else ""
                self.add(f"{where} .{key}", "unknown-key",
                         f"expected one of {', '.join(LAYER_KEYS)}, found unknown key {key!r}{extra}")
        for key in ("name", "matches", "kind"):
            if key not in layer:
                self.add(where, "required-key", f"expected key {key!r}, found none")
        if "name" in layer:
            self.name(where, index, layer["name"], names)
        if "comment" in layer:
            problem = _optional(_string)(layer["comment"])
            if problem:
                self.add(f"{where} .comment", "field-type", problem)
        if layer.get("template") is not None:
            self.template(where, layer["template"])
        body = self.kind(where, layer["kind"])[1] if "kind" in layer else None
        if "matches" in layer:
            self.matches(where, index, layer["matches"], last, layer.get("template") is not None, body)

    def name(self, where: str, index: int, name: Any, names: Dict[str, int]) -> None:
        if not isinstance(name, str):
            self.add(f"{where} .name", "field-type", "expected a string, " + _found(name))
            return
        raw = name.encode("utf-8")
        if not name or not name.isascii() or len(raw) > MAX_NAME_BYTES or not name.isprintable():
            self.add(f"{where} .name", "layer-name",
                     f"expected printable ASCII of 1..{MAX_NAME_BYTES} bytes, found {_show(name)} ({len(raw)} bytes)")
        if name in names:
            self.add(f"{where} .name", "duplicate-name",
                     f"expected a unique name (stats are keyed by name), found {_show(name)} again (first at layer[{names[name]}])")
        else:
            names[name] = index

    def template(self, where: str, template: Any) -> None:
        path = f"{where} .template"
        kind = self.match_term(path, template)
        if kind is None:
            return
        if kind not in TEMPLATE_MATCHES:
            self.add(path, "template-type", f"expected a CgroupSuffix or CgroupRegex match, found {kind} "
                                            "(scx_layered panics on any other template type)")
            return
        self.add(path, "template-startup", "the template is expanded once at startup by walking /sys/fs/cgroup; "
                                           "cgroups created later get no layer, and the layer count after expansion "
                                           f"must still be <= {MAX_LAYERS}", WARNING)

    # -- matches --

    def matches(self, where: str, index: int, matches: Any, last: bool, has_template: bool, body: Any) -> None:
        path = f"{where} .matches"
        if not isinstance(matches, list) or not all(isinstance(block, list) for block in matches):
            self.add(path, "matches-shape", "expected an array of AND blocks (arrays of match objects), " + _found(matches))
            return
        if last:
            if len(matches) != 1 or matches[0]:
                self.add(path, "terminal-layer", f"expected [[]] on the last layer (the catch-all), found {_show(matches)}")
        elif not matches:
            self.add(path, "matches-empty", "expected at least one OR block on a layer that is not the last, found []")
        if len(matches) > MAX_ORS:
            self.add(path, "or-limit", f"expected at most {MAX_ORS} OR blocks, found {len(matches)}")
        growth = body.get("growth_algo") if isinstance(body, dict) else None
        for o, block in enumerate(matches):
            bpath = f"{path}[{o}]"
            if not block and not last:
                self.add(bpath, "match-all-block", "an empty AND block matches every task: the layers after this one "
                                                   "can never match", WARNING)
            if len(block) > MAX_ANDS:
                self.add(bpath, "and-limit", f"expected at most {MAX_ANDS} terms, found {len(block)}")
            kinds = []
            for a, term in enumerate(block):
                kind = self.match_term(f"{bpath}[{a}]", term)
                kinds.append(kind)
                if kind == "NumaNode" and growth in NODE_SPREAD_ALGOS:
                    self.add(f"{bpath}[{a}].NumaNode", "numa-node-spread",
                             f"expected no NumaNode match with growth_algo {growth} (NodeSpread* spreads over all "
                             "NUMA nodes, NumaNode restricts to one)")
            self.hint_block(bpath, index, block, kinds)

    def match_term(self, path: str, term: Any) -> Optional[str]:
        if not isinstance(term, dict) or len(term) != 1:
            self.add(path, "match-term", "expected an object with exactly one key such as {\"CommPrefix\": \"java\"}, "
                     + _found(term))
            return None
        kind, value = next(iter(term.items()))
        if kind not in MATCH_VALUES:
            self.add(f"{path}.{kind}", "unknown-match",
                     f"expected a match kind scx_layered knows ({', '.join(sorted(MATCH_VALUES))}), found {kind!r}")
            return None
        problem = MATCH_VALUES[kind](value)
        if problem:
            self.add(f"{path}.{kind}", "match-value", problem)
            return kind
        mpath = f"{path}.{kind}"
        limit = _STRING_LIMITS.get(kind)
        if limit is not None and len(value.encode("utf-8")) > limit:
            why = " (thread names are at most 15 bytes)" if limit == MAX_COMM_BYTES else ""
            self.add(mpath, "match-length",
                     f"expected at most {limit} bytes{why}, found {len(value.encode('utf-8'))} bytes: {_show(value)}")
        if kind in ("CgroupPrefix", "CgroupContains", "CgroupSuffix") and value.startswith("/") and value != "/":
            self.add(mpath, "cgroup-path", f"cgroup paths are matched without the leading '/' "
                                           f"(e.g. \"system.slice/x.service/\"), found {_show(value)}", WARNING)
        if kind == "CgroupSuffix" and not value.endswith("/"):
            self.add(mpath, "cgroup-path", f"cgroup paths always end with '/', so this suffix never matches: {_show(value)}",
                     WARNING)
        if kind == "CgroupRegex":
            self.regexes += 1
            try:
                re.compile(value)
            except re.error as exc:
                self.add(mpath, "cgroup-regex", f"expected a regular expression, found {_show(value)}: {exc}")
        elif kind == "AvgRuntime" and value[0] >= value[1]:
            self.add(mpath, "avg-runtime", f"expected [min_us, max_us] with min < max (min <= avg < max), found {_show(value)}")
        elif kind == "HintEquals" and value > MAX_HINT:
            self.add(mpath, "hint-range", f"expected 0..{MAX_HINT}, found {value}")
        elif kind in ("SystemCpuUtilBelow", "DsqInsertBelow") and not 0.0 <= value <= 1.0:
            self.add(mpath, "threshold-range", f"expected a fraction 0.0..1.0, found {value}")
        elif kind == "IsKthread" and value is False:
            self.add(mpath, "iskthread-value", "scx_layered ignores the value: {\"IsKthread\": false} still matches "
                                               "every kernel thread", WARNING)
        elif kind in ("UsedGpuTid", "UsedGpuPid") and not self.gpu_support:
            self.add(mpath, "gpu-support", f"{kind} needs scx_layered --enable-gpu-support; without it the BPF side "
                                           "errors and the scheduler exits", WARNING)
        return kind

    def hint_block(self, path: str, index: int, block: List[Any], kinds: List[Optional[str]]) -> None:
        hints = [term["HintEquals"] for term, kind in zip(block, kinds) if kind == "HintEquals"]
        high = [k for k in kinds if k in ("SystemCpuUtilBelow", "DsqInsertBelow")]
        if len(hints) > 1:
            self.add(path, "hint-block", f"expected at most one HintEquals per AND block, found {len(hints)}")
        if high:
            if len(hints) != 1:
                self.add(path, "hint-block", "expected SystemCpuUtilBelow / DsqInsertBelow together with exactly one "
                                             f"HintEquals, found {len(hints)}")
            for kind in ("SystemCpuUtilBelow", "DsqInsertBelow"):
                if high.count(kind) > 1:
                    self.add(path, "hint-block", f"expected at most one {kind} per AND block, found {high.count(kind)}")
            others = [k for k in kinds if k not in ("HintEquals", "SystemCpuUtilBelow", "DsqInsertBelow")]
            if others:
                self.add(path, "hint-block", "expected only HintEquals, SystemCpuUtilBelow and DsqInsertBelow in this "
                                             f"block, found also {', '.join(str(k) for k in others)}")
        elif hints and len(block) != 1:
            self.add(path, "hint-block", f"expected HintEquals alone in its AND block, found {len(block)} terms")
        for hint in hints:
            if not _is_int(hint):
                continue
            first = self.hints.setdefault(hint, index)
            if first != index:
                self.add(path, "hint-unique", f"expected HintEquals {hint} in one layer only, found it already in layer[{first}]")

    # -- kind --

    def kind(self, where: str, kind: Any) -> Tuple[Optional[str], Any]:
        path = f"{where} .kind"
        if not isinstance(kind, dict) or len(kind) != 1:
            hint = ""
            if isinstance(kind, str) and kind in KINDS:
                hint = f" (write {{\"{kind}\": {{...}}}})"
            self.add(path, "kind-shape", "expected an object with exactly one of Confined, Grouped, Open, "
                     + _found(kind) + hint)
            return None, None
        name, body = next(iter(kind.items()))
        if name not in KINDS:
            extra = " (Overload was proposed upstream but never shipped; use Grouped with idle_confined)" \
                if name == "Overload" else ""
            self.add(f"{path}.{name}", "kind-shape", f"expected Confined, Grouped or Open, found {name!r}{extra}")
            return None, None
        kpath = f"{path}.{name}"
        if not isinstance(body, dict):
            self.add(kpath, "field-type", "expected an object of layer settings, " + _found(body))
            return name, None
        self.kind_fields(kpath, name, body)
        return name, body

    def kind_fields(self, path: str, kind: str, body: Dict[str, Any]) -> None:
        fields = KIND_FIELDS[kind]
        for key, value in body.items():
            fpath = f"{path}.{key}"
            if key in fields:
                problem = fields[key](value)
                if problem:
                    self.add(fpath, "field-type", problem)
            elif key in DEPRECATED_FIELDS:
                problem = DEPRECATED_FIELDS[key](value)
                if problem:
                    self.add(fpath, "field-type", problem)
                self.add(fpath, "deprecated-key", f"{key} is deprecated: scx_layered accepts and ignores it", WARNING)
            elif key in RENAMED_FIELDS:
                self.add(fpath, "renamed-key", f"expected {RENAMED_FIELDS[key]!r}, found the old name {key!r} "
                                               "(scx_layered ignores it silently)")
            else:
                owners = [k for k in KINDS if key in KIND_FIELDS[k]]
                if owners:
                    self.add(fpath, "kind-field", f"{key} is a field of {' and '.join(owners)}, not of {kind} "
                                                  "(scx_layered would ignore it)")
                else:
                    self.add(fpath, "unknown-key", f"expected a known {kind} field, found unknown key {key!r}")
        if kind != "Open" and "util_range" not in body:
            self.add(path, "required-key", f"expected key 'util_range' ([lo, hi]) on a {kind} layer, found none")
        self.kind_values(path, kind, body)

    def kind_values(self, path: str, kind: str, body: Dict[str, Any]) -> None:
        def good(key: str) -> bool:
            return key in body and body[key] is not None and not KIND_FIELDS[kind].get(key, _bool)(body[key])

        if kind != "Open":
            if good("util_range"):
                lo, hi = body["util_range"]
                if not 0 <= lo < hi:
                    self.add(f"{path}.util_range", "util-range", f"expected [lo, hi] with 0 <= lo < hi, found {_show(body['util_range'])}")
            if good("cpus_range"):
                lo, hi = body["cpus_range"]
                if lo > hi:
                    self.add(f"{path}.cpus_range", "cpus-range", f"expected [min, max] with min <= max, found {_show([lo, hi])}")
                elif kind == "Confined" and hi < 1:
                    self.add(f"{path}.cpus_range", "cpus-range", f"expected max >= 1 on a Confined layer, found {_show([lo, hi])}")
                if self.cpu_count is not None and hi > self.cpu_count:
                    self.add(f"{path}.cpus_range", "cpus-range-host",
                             f"expected max <= {self.cpu_count} (this host's CPUs), found {hi}")
            if good("cpus_range_frac"):
                lo, hi = body["cpus_range_frac"]
                if not (0.0 <= lo <= 1.0 and 0.0 <= hi <= 1.0 and lo <= hi):
                    self.add(f"{path}.cpus_range_frac", "cpus-range-frac",
                             f"expected [min, max] fractions in 0.0..1.0 with min <= max, found {_show([lo, hi])}")
            if body.get("cpus_range") is not None and body.get("cpus_range_frac") is not None:
                self.add(f"{path}.cpus_range_frac", "cpus-range-conflict",
                         "expected cpus_range or cpus_range_frac, found both (scx_layered refuses to start)")
            if good("membw_gb"):
                self.add(f"{path}.membw_gb", "membw", "membw_gb makes scx_layered panic on CPU models it has no memory "
                                                      "bandwidth counters for", WARNING)
        if kind == "Open" and good("util_peak_half_life_ms") and body["util_peak_half_life_ms"] != 0:
            self.add(f"{path}.util_peak_half_life_ms", "peak-half-life-open",
                     f"expected 0 on an Open layer (it has no util_range), found {body['util_peak_half_life_ms']}")
        if good("growth_algo"):
            algo = body["growth_algo"]
            if algo not in GROWTH_ALGOS:
                close = [a for a in GROWTH_ALGOS if a.lower() == algo.lower()]
                self.add(f"{path}.growth_algo", "growth-algo", f"expected one of {', '.join(GROWTH_ALGOS)} (spelled exactly), "
                         f"found {_show(algo)}" + (f"; did you mean {close[0]!r}?" if close else ""))
            elif algo == "StickyDynamic":
                self.add(f"{path}.growth_algo", "growth-algo-risky", "StickyDynamic gave a Confined layer 0 CPUs on "
                         "large hosts (open upstream report); Sticky or Topo are safer", WARNING)
        if good("placement") and body["placement"] not in PLACEMENTS:
            self.add(f"{path}.placement", "placement", f"expected one of {', '.join(PLACEMENTS)}, found {_show(body['placement'])}")
        if good("weight") and body["weight"] > MAX_WEIGHT:
            self.add(f"{path}.weight", "weight-range", f"expected 1..{MAX_WEIGHT} (0 = default 100), found {body['weight']}")
        if good("perf") and body["perf"] > MAX_PERF:
            self.add(f"{path}.perf", "perf-range", f"expected 0 (unset) or 1..{MAX_PERF}, found {body['perf']}")
        if good("yield_ignore") and not 0.0 <= body["yield_ignore"] <= 1.0:
            self.add(f"{path}.yield_ignore", "yield-ignore-range", f"expected 0.0..1.0, found {body['yield_ignore']}")
        for key in ("nodes", "llcs"):
            if good(key) and len(set(body[key])) != len(body[key]):
                self.add(f"{path}.{key}", "node-ids", f"expected each ID once, found {_show(body[key])}")
        for key in ("xnuma_threshold", "xnuma_threshold_delta"):
            if good(key) and body[key][0] > body[key][1]:
                self.add(f"{path}.{key}", "xnuma-threshold", f"expected [lo, hi] with lo <= hi, found {_show(body[key])}",
                         WARNING)
        if kind == "Open" and good("weight"):
            # main.rs passes weights to the CPU allocator only (alloc.rs water_fill); dispatch and
            # preemption never read them, and an Open layer is allocated no CPUs.
            self.add(f"{path}.weight", "open-weight", "an Open layer's weight has no effect: scx_layered uses weights only "
                     "to divide CPUs among Confined and Grouped layers (use preempt, or a Grouped layer)", WARNING)
        if body.get("preempt_first") is True and body.get("preempt") is not True:
            self.add(f"{path}.preempt_first", "preempt-first-alone", "preempt_first has no effect without preempt: true",
                     WARNING)
        if body.get("preempt") is True:
            for key in ("disallow_open_after_us", "disallow_preempt_after_us"):
                if body.get(key) is not None:
                    self.add(f"{path}.{key}", "preempt-overrides", f"{key} is ignored on a preempting layer "
                                                                    "(scx_layered forces it to never)", WARNING)
