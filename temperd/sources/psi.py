"""Pressure stall information: how long tasks stalled on CPU, memory or I/O, as cumulative
microseconds (the `total=` fields) so any window's share is a difference. For the host
(/proc/pressure) and for one cgroup (its cpu/memory/io.pressure on the cgroup v2 tree, mounted
at the root on unified hosts and at unified/ on hybrid ones)."""

from __future__ import annotations

import os
from typing import Dict, NamedTuple, Optional

from temperd.files import kernel_lines, read_stripped
from temperd.sources.cgroups import CGROUP_ROOT, v2_dir

RESOURCES = ("cpu", "memory", "io")
HOST_DIR = "/proc/pressure"


class PressureTotals(NamedTuple):
    some_us: int
    full_us: Optional[int]  # the host's cpu line has no meaningful full before 5.13


def parse_pressure(text: str) -> Optional[PressureTotals]:
    totals: Dict[str, int] = {}
    for line in kernel_lines(text):
        kind, *pairs = line.split()
        for pair in pairs:
            key, _, value = pair.partition("=")
            if key == "total":
                totals[kind] = int(value)
    if "some" not in totals:
        return None
    return PressureTotals(totals["some"], totals.get("full"))


def pressure_fields(text: str) -> Dict[str, Dict[str, float]]:
    """Every field of a pressure file: {"some": {"avg10": 1.5, ..., "total": 123}, "full": {...}}."""
    out: Dict[str, Dict[str, float]] = {}
    for line in kernel_lines(text):
        kind, *pairs = line.split()
        out[kind] = {k: float(v) if "." in v else int(v) for k, v in (p.split("=", 1) for p in pairs)}
    return out


def _parsed(path: str, parse):
    """A pressure file parsed; None where the kernel has none, it cannot be read or holds garbage."""
    text = read_stripped(path)
    try:
        return parse(text) if text else None
    except ValueError:
        return None


def host_fields(resource: str = "cpu", directory: str = HOST_DIR) -> Optional[Dict[str, Dict[str, float]]]:
    """The host's pressure file for one resource, every field (averages and totals)."""
    return _parsed(os.path.join(directory, resource), pressure_fields)


def _totals(directory: str, suffix: str) -> Dict[str, PressureTotals]:
    totals = {resource: _parsed(os.path.join(directory, resource + suffix), parse_pressure) for resource in RESOURCES}
    return {resource: value for resource, value in totals.items() if value is not None}


def host_pressure(directory: str = HOST_DIR) -> Dict[str, PressureTotals]:
    """resource -> totals; empty where the kernel has no PSI (psi=0, CONFIG_PSI off)."""
    return _totals(directory, "")


def cgroup_pressure(cgroup: str, root: str = CGROUP_ROOT) -> Dict[str, PressureTotals]:
    """resource -> totals of one cgroup (its v2 path); empty where it has no pressure files
    (no cgroup v2 tree, the root cgroup, a kernel without PSI)."""
    directory = v2_dir(cgroup, root)
    return _totals(directory, ".pressure") if directory is not None else {}
