"""Hardware counters (IPC, last-level cache misses) through perf events: only where the host has a
PMU (/sys/bus/event_source/devices/cpu, or cpu_core/cpu_atom on hybrid Intel parts). VMs without
a virtual PMU have none; the classification then says so and its confidence reflects it.

Counting itself is not wired yet: where a PMU exists the source says that instead of guessing."""

from __future__ import annotations

import os
from typing import Tuple

DEVICES = "/sys/bus/event_source/devices"
PMU_NAMES = ("cpu", "cpu_core", "cpu_atom", "armv8_pmuv3_0", "armv8_pmuv3")


def pmu_state(devices: str = DEVICES) -> Tuple[bool, str]:
    """(usable, why not)."""
    if not any(os.path.isdir(os.path.join(devices, name)) for name in PMU_NAMES):
        return False, "no PMU (no hardware perf events on this host)"
    return False, "PMU present; per-workload counting not implemented yet"
