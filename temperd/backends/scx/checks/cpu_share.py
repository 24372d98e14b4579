"""The CPU share a Confined or Grouped layer asks for: util_range, cpus_range (against the host's
CPU count when known), cpus_range_frac, and membw_gb."""

from __future__ import annotations

from typing import Any, Dict, Optional

from temperd.backends.scx.checks.problems import WARNING, Findings
from temperd.backends.scx.checks.spec import well_typed
from temperd.backends.scx.checks.value_types import show


def check_cpu_share(findings: Findings, path: str, kind: str, body: Dict[str, Any], cpu_count: Optional[int]) -> None:
    if kind == "Open":  # it owns no CPUs (these fields on it are kind-field problems)
        return
    if well_typed(kind, body, "util_range"):
        lo, hi = body["util_range"]
        if not 0 <= lo < hi:
            findings.add(f"{path}.util_range", "util-range", f"expected [lo, hi] with 0 <= lo < hi, found {show(body['util_range'])}")
    if well_typed(kind, body, "cpus_range"):
        lo, hi = body["cpus_range"]
        if lo > hi:
            findings.add(f"{path}.cpus_range", "cpus-range", f"expected [min, max] with min <= max, found {show([lo, hi])}")
        elif kind == "Confined" and hi < 1:
            findings.add(f"{path}.cpus_range", "cpus-range", f"expected max >= 1 on a Confined layer, found {show([lo, hi])}")
        if cpu_count is not None and hi > cpu_count:
            findings.add(f"{path}.cpus_range", "cpus-range-host",
                         f"expected max <= {cpu_count} (this host's CPUs), found {hi}")
    if well_typed(kind, body, "cpus_range_frac"):
        lo, hi = body["cpus_range_frac"]
        if not (0.0 <= lo <= 1.0 and 0.0 <= hi <= 1.0 and lo <= hi):
            findings.add(f"{path}.cpus_range_frac", "cpus-range-frac",
                         f"expected [min, max] fractions in 0.0..1.0 with min <= max, found {show([lo, hi])}")
    if body.get("cpus_range") is not None and body.get("cpus_range_frac") is not None:
        findings.add(f"{path}.cpus_range_frac", "cpus-range-conflict",
                     "expected cpus_range or cpus_range_frac, found both (scx_layered refuses to start)")
    if well_typed(kind, body, "membw_gb"):
        findings.add(f"{path}.membw_gb", "membw", "membw_gb makes scx_layered panic on CPU models it has no memory "
                                                  "bandwidth counters for", WARNING)
