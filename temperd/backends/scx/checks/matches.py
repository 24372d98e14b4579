"""A layer's match rules: `matches` is an array of OR blocks, each an AND block of match terms.
What one term must hold, what a block may combine (HintEquals), and the counts a whole config is
limited to (CgroupRegex terms, one layer per HintEquals value) are checked here."""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional

from temperd.backends.scx.checks.problems import WARNING, Findings
from temperd.backends.scx.checks.spec import (MATCH_VALUES, MAX_ANDS, MAX_COMM_BYTES, MAX_HINT, MAX_ORS,
                                              NODE_SPREAD_ALGOS, STRING_LIMITS)
from temperd.backends.scx.checks.value_types import found, is_int, show

_THRESHOLDS = ("SystemCpuUtilBelow", "DsqInsertBelow")  # allowed beside a HintEquals only


class MatchChecker:
    """One per config: it counts across layers (CgroupRegex terms, HintEquals values)."""

    def __init__(self, findings: Findings, gpu_support: bool):
        self.findings = findings
        self.gpu_support = gpu_support
        self.hints: Dict[int, int] = {}  # HintEquals value -> layer index
        self.regexes = 0

    def check(self, where: str, index: int, matches: Any, last: bool, body: Any) -> None:
        """One layer's `matches`; body: its kind's settings (growth_algo bears on NumaNode terms)."""
        add = self.findings.add
        path = f"{where} .matches"
        if not isinstance(matches, list) or not all(isinstance(block, list) for block in matches):
            add(path, "matches-shape", "expected an array of AND blocks (arrays of match objects), " + found(matches))
            return
        if last:
            if len(matches) != 1 or matches[0]:
                add(path, "terminal-layer", f"expected [[]] on the last layer (the catch-all), found {show(matches)}")
        elif not matches:
            add(path, "matches-empty", "expected at least one OR block on a layer that is not the last, found []")
        if len(matches) > MAX_ORS:
            add(path, "or-limit", f"expected at most {MAX_ORS} OR blocks, found {len(matches)}")
        growth = body.get("growth_algo") if isinstance(body, dict) else None
        for o, block in enumerate(matches):
            bpath = f"{path}[{o}]"
            if not block and not last:
                add(bpath, "match-all-block", "an empty AND block matches every task: the layers after this one "
                                              "can never match", WARNING)
            if len(block) > MAX_ANDS:
                add(bpath, "and-limit", f"expected at most {MAX_ANDS} terms, found {len(block)}")
            kinds = []
            for a, term in enumerate(block):
                kind = self.term(f"{bpath}[{a}]", term)
                kinds.append(kind)
                if kind == "NumaNode" and growth in NODE_SPREAD_ALGOS:
                    add(f"{bpath}[{a}].NumaNode", "numa-node-spread",
                        f"expected no NumaNode match with growth_algo {growth} (NodeSpread* spreads over all "
                        "NUMA nodes, NumaNode restricts to one)")
            self.hint_block(bpath, index, block, kinds)

    def term(self, path: str, term: Any) -> Optional[str]:
        """One match object; its kind, None when it has none scx_layered knows."""
        add = self.findings.add
        if not isinstance(term, dict) or len(term) != 1:
            add(path, "match-term", "expected an object with exactly one key such as {\"CommPrefix\": \"java\"}, "
                + found(term))
            return None
        kind, value = next(iter(term.items()))
        if kind not in MATCH_VALUES:
            add(f"{path}.{kind}", "unknown-match",
                f"expected a match kind scx_layered knows ({', '.join(sorted(MATCH_VALUES))}), found {kind!r}")
            return None
        problem = MATCH_VALUES[kind](value)
        if problem:
            add(f"{path}.{kind}", "match-value", problem)
            return kind
        mpath = f"{path}.{kind}"
        limit = STRING_LIMITS.get(kind)
        if limit is not None and len(value.encode("utf-8")) > limit:
            why = " (thread names are at most 15 bytes)" if limit == MAX_COMM_BYTES else ""
            add(mpath, "match-length",
                f"expected at most {limit} bytes{why}, found {len(value.encode('utf-8'))} bytes: {show(value)}")
        if kind in ("CgroupPrefix", "CgroupContains", "CgroupSuffix") and value.startswith("/") and value != "/":
            add(mpath, "cgroup-path", f"cgroup paths are matched without the leading '/' "
                                      f"(e.g. \"system.slice/x.service/\"), found {show(value)}", WARNING)
        if kind == "CgroupSuffix" and not value.endswith("/"):
            add(mpath, "cgroup-path", f"cgroup paths always end with '/', so this suffix never matches: {show(value)}",
                WARNING)
        if kind == "CgroupRegex":
            self.regexes += 1
            try:
                re.compile(value)
            except re.error as exc:
                add(mpath, "cgroup-regex", f"expected a regular expression, found {show(value)}: {exc}")
        elif kind == "AvgRuntime" and value[0] >= value[1]:
            add(mpath, "avg-runtime", f"expected [min_us, max_us] with min < max (min <= avg < max), found {show(value)}")
        elif kind == "HintEquals" and value > MAX_HINT:
            add(mpath, "hint-range", f"expected 0..{MAX_HINT}, found {value}")
        elif kind in _THRESHOLDS and not 0.0 <= value <= 1.0:
            add(mpath, "threshold-range", f"expected a fraction 0.0..1.0, found {value}")
        elif kind == "IsKthread" and value is False:
            add(mpath, "iskthread-value", "scx_layered ignores the value: {\"IsKthread\": false} still matches "
                                          "every kernel thread", WARNING)
        elif kind in ("UsedGpuTid", "UsedGpuPid") and not self.gpu_support:
            add(mpath, "gpu-support", f"{kind} needs scx_layered --enable-gpu-support; without it the BPF side "
                                      "errors and the scheduler exits", WARNING)
        return kind

    def hint_block(self, path: str, index: int, block: List[Any], kinds: List[Optional[str]]) -> None:
        add = self.findings.add
        hints = [term["HintEquals"] for term, kind in zip(block, kinds) if kind == "HintEquals"]
        high = [k for k in kinds if k in _THRESHOLDS]
        if len(hints) > 1:
            add(path, "hint-block", f"expected at most one HintEquals per AND block, found {len(hints)}")
        if high:
            if len(hints) != 1:
                add(path, "hint-block", "expected SystemCpuUtilBelow / DsqInsertBelow together with exactly one "
                                        f"HintEquals, found {len(hints)}")
            for kind in _THRESHOLDS:
                if high.count(kind) > 1:
                    add(path, "hint-block", f"expected at most one {kind} per AND block, found {high.count(kind)}")
            others = [k for k in kinds if k not in ("HintEquals", *_THRESHOLDS)]
            if others:
                add(path, "hint-block", "expected only HintEquals, SystemCpuUtilBelow and DsqInsertBelow in this "
                                        f"block, found also {', '.join(str(k) for k in others)}")
        elif hints and len(block) != 1:
            add(path, "hint-block", f"expected HintEquals alone in its AND block, found {len(block)} terms")
        for hint in hints:
            if not is_int(hint):
                continue
            first = self.hints.setdefault(hint, index)
            if first != index:
                add(path, "hint-unique", f"expected HintEquals {hint} in one layer only, found it already in layer[{first}]")
