"""RAPL energy counters through powercap (/sys/class/powercap/intel-rapl:*): host-wide package and
DRAM energy, whose ratio says how much of the energy goes to memory. Host-wide only: RAPL has no
per-process counters, so it speaks for a workload only where that workload dominates the host."""

from __future__ import annotations

import glob
import os
from typing import NamedTuple, Optional, Tuple

from temperd.files import read_stripped

POWERCAP = "/sys/class/powercap"


class Energy(NamedTuple):
    package_uj: int
    dram_uj: int
    max_uj: int  # the counters wrap at max_energy_range_uj


def read_energy(root: str = POWERCAP) -> Tuple[Optional[Energy], str]:
    """(energy, why not): the sum over packages and their dram subzones."""
    if not os.path.isdir(root):
        return None, f"no {root} (no RAPL powercap on this host)"
    package = dram = 0
    max_uj = 0
    zones = sorted(glob.glob(os.path.join(root, "intel-rapl:*")))
    for zone in zones:
        name = read_stripped(os.path.join(zone, "name")) or ""
        value = read_stripped(os.path.join(zone, "energy_uj"))
        if value is None or not value.isdigit():
            continue
        if name.startswith("package"):
            package += int(value)
            max_uj = max(max_uj, int(read_stripped(os.path.join(zone, "max_energy_range_uj")) or 0))
        elif name == "dram":
            dram += int(value)
    if package == 0:
        return None, f"no readable package energy under {root}"
    return Energy(package, dram, max_uj), ""
