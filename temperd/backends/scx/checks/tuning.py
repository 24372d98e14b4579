"""The rest of a layer's settings, any kind: growth_algo, placement, weight, perf, yield_ignore,
the NUMA and LLC lists, and the preemption settings (some of which scx_layered ignores)."""

from __future__ import annotations

from typing import Any, Dict

from temperd.backends.scx.checks.problems import WARNING, Findings
from temperd.backends.scx.checks.spec import GROWTH_ALGOS, MAX_PERF, MAX_WEIGHT, PLACEMENTS, well_typed
from temperd.backends.scx.checks.value_types import show


def check_tuning(findings: Findings, path: str, kind: str, body: Dict[str, Any]) -> None:
    def good(key: str) -> bool:
        return well_typed(kind, body, key)

    if kind == "Open" and good("util_peak_half_life_ms") and body["util_peak_half_life_ms"] != 0:
        findings.add(f"{path}.util_peak_half_life_ms", "peak-half-life-open",
                     f"expected 0 on an Open layer (it has no util_range), found {body['util_peak_half_life_ms']}")
    if good("growth_algo"):
        check_growth_algo(findings, f"{path}.growth_algo", body["growth_algo"])
    if good("placement") and body["placement"] not in PLACEMENTS:
        findings.add(f"{path}.placement", "placement", f"expected one of {', '.join(PLACEMENTS)}, found {show(body['placement'])}")
    if good("weight") and body["weight"] > MAX_WEIGHT:
        findings.add(f"{path}.weight", "weight-range", f"expected 1..{MAX_WEIGHT} (0 = default 100), found {body['weight']}")
    if good("perf") and body["perf"] > MAX_PERF:
        findings.add(f"{path}.perf", "perf-range", f"expected 0 (unset) or 1..{MAX_PERF}, found {body['perf']}")
    if good("yield_ignore") and not 0.0 <= body["yield_ignore"] <= 1.0:
        findings.add(f"{path}.yield_ignore", "yield-ignore-range", f"expected 0.0..1.0, found {body['yield_ignore']}")
    for key in ("nodes", "llcs"):
        if good(key) and len(set(body[key])) != len(body[key]):
            findings.add(f"{path}.{key}", "node-ids", f"expected each ID once, found {show(body[key])}")
    for key in ("xnuma_threshold", "xnuma_threshold_delta"):
        if good(key) and body[key][0] > body[key][1]:
            findings.add(f"{path}.{key}", "xnuma-threshold", f"expected [lo, hi] with lo <= hi, found {show(body[key])}",
                         WARNING)
    if kind == "Open" and good("weight"):
        # main.rs passes weights to the CPU allocator only (alloc.rs water_fill); dispatch and
        # preemption never read them, and an Open layer is allocated no CPUs.
        findings.add(f"{path}.weight", "open-weight", "an Open layer's weight has no effect: scx_layered uses weights only "
                     "to divide CPUs among Confined and Grouped layers (use preempt, or a Grouped layer)", WARNING)
    check_preemption(findings, path, body)


def check_growth_algo(findings: Findings, path: str, algo: str) -> None:
    if algo not in GROWTH_ALGOS:
        close = [a for a in GROWTH_ALGOS if a.lower() == algo.lower()]
        findings.add(path, "growth-algo", f"expected one of {', '.join(GROWTH_ALGOS)} (spelled exactly), "
                     f"found {show(algo)}" + (f"; did you mean {close[0]!r}?" if close else ""))
    elif algo == "StickyDynamic":
        findings.add(path, "growth-algo-risky", "StickyDynamic gave a Confined layer 0 CPUs on "
                     "large hosts (open upstream report); Sticky or Topo are safer", WARNING)


def check_preemption(findings: Findings, path: str, body: Dict[str, Any]) -> None:
    if body.get("preempt_first") is True and body.get("preempt") is not True:
        findings.add(f"{path}.preempt_first", "preempt-first-alone", "preempt_first has no effect without preempt: true",
                     WARNING)
    if body.get("preempt") is True:
        for key in ("disallow_open_after_us", "disallow_preempt_after_us"):
            if body.get(key) is not None:
                findings.add(f"{path}.{key}", "preempt-overrides", f"{key} is ignored on a preempting layer "
                                                                   "(scx_layered forces it to never)", WARNING)
