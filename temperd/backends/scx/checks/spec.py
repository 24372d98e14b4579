"""What a scx_layered (1.1.x) config holds, as data: its limits (main.rs, intf.h), the names it
accepts, and the JSON type of each layer-spec field and match kind."""

from __future__ import annotations

from typing import Any, Dict

from temperd.backends.scx.checks.value_types import (TypeCheck, boolean, f64, i32, optional, pair, string, u32, u64,
                                                     usize, vec)

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

GROWTH_ALGOS = ("Sticky", "Linear", "Reverse", "Random", "Topo", "RoundRobin", "BigLittle", "LittleBig",
                "NodeSpread", "NodeSpreadReverse", "NodeSpreadRandom", "CpuSetSpread", "CpuSetSpreadReverse",
                "CpuSetSpreadRandom", "RandomTopo", "StickyDynamic")
NODE_SPREAD_ALGOS = ("NodeSpread", "NodeSpreadReverse", "NodeSpreadRandom")
PLACEMENTS = ("Standard", "Sticky", "Floating")
KINDS = ("Confined", "Grouped", "Open")

COMMON_FIELDS: Dict[str, TypeCheck] = {
    "min_exec_us": u64,
    "yield_ignore": f64,
    "slice_us": u64,
    "fifo": boolean,
    "preempt": boolean,
    "preempt_first": boolean,
    "exclusive": boolean,
    "skip_remote_node": boolean,
    "prev_over_idle_core": boolean,
    "weight": u32,
    "disallow_open_after_us": optional(u64),
    "disallow_preempt_after_us": optional(u64),
    "xllc_mig_min_us": f64,
    "growth_algo": string,
    "util_peak_half_life_ms": u64,
    "perf": u64,
    "idle_resume_us": optional(u32),
    "nodes": vec(usize, "non-negative integers"),
    "llcs": vec(usize, "non-negative integers"),
    "placement": string,
    "member_expire_ms": u64,
    "xnuma_threshold": pair(f64, f64, "number, number"),
    "xnuma_threshold_delta": pair(f64, f64, "number, number"),
}
DEPRECATED_FIELDS: Dict[str, TypeCheck] = {"idle_smt": optional(boolean), "allow_node_aligned": optional(boolean)}
OWNING_FIELDS: Dict[str, TypeCheck] = {  # Confined and Grouped
    "util_range": pair(f64, f64, "lo, hi"),
    "cpus_range": optional(pair(usize, usize, "min, max")),
    "cpus_range_frac": optional(pair(f64, f64, "min fraction, max fraction")),
    "membw_gb": optional(f64),
    "protected": boolean,
}
GROUPED_ONLY_FIELDS: Dict[str, TypeCheck] = {"util_includes_open_cputime": boolean, "idle_confined": boolean}
KIND_FIELDS: Dict[str, Dict[str, TypeCheck]] = {
    "Confined": {**OWNING_FIELDS, **COMMON_FIELDS},
    "Grouped": {**OWNING_FIELDS, **GROUPED_ONLY_FIELDS, **COMMON_FIELDS},
    "Open": dict(COMMON_FIELDS),
}
RENAMED_FIELDS = {"cpus_pct": "cpus_range_frac", "cpus_range_pct": "cpus_range_frac",
                  "same_over_idle": "prev_over_idle_core"}
LAYER_KEYS = ("name", "comment", "template", "matches", "kind")

STRING_LIMITS = {"CgroupPrefix": MAX_PATH_BYTES, "CgroupSuffix": MAX_PATH_BYTES, "CgroupContains": MAX_PATH_BYTES,
                 "CommPrefix": MAX_COMM_BYTES, "CommPrefixExclude": MAX_COMM_BYTES, "PcommPrefix": MAX_COMM_BYTES,
                 "PcommPrefixExclude": MAX_COMM_BYTES, "CmdJoin": MAX_COMM_BYTES}
MATCH_VALUES: Dict[str, TypeCheck] = {
    **{kind: string for kind in STRING_LIMITS},
    "CgroupRegex": string,
    "NiceAbove": i32, "NiceBelow": i32, "NiceEquals": i32,
    "UIDEquals": u32, "GIDEquals": u32, "PIDEquals": u32, "PPIDEquals": u32, "TGIDEquals": u32,
    "NSPIDEquals": pair(u64, u32, "pid-namespace inode, pid"),
    "NSEquals": u32,
    "IsGroupLeader": boolean, "IsKthread": boolean, "UsedGpuTid": boolean, "UsedGpuPid": boolean,
    "AvgRuntime": pair(u64, u64, "min_us, max_us"),
    "HintEquals": u64,
    "SystemCpuUtilBelow": f64, "DsqInsertBelow": f64,
    "NumaNode": u32,
}
TEMPLATE_MATCHES = ("CgroupSuffix", "CgroupRegex")


def well_typed(kind: str, body: Dict[str, Any], key: str) -> bool:
    """The field is set (not null) with the type the kind gives it, so its value can be checked."""
    return key in body and body[key] is not None and not KIND_FIELDS[kind].get(key, boolean)(body[key])
