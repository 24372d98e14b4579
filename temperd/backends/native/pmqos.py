"""Per-CPU idle-resume bound: /sys/devices/system/cpu/cpuN/power/pm_qos_resume_latency_us.

The cpuidle governor keeps a CPU out of idle states whose exit latency exceeds the bound, so a
wakeup on that CPU does not first pay for leaving a deep state (on a KVM guest: a halted vCPU
that the host must reschedule). The native counterpart of scx_layered's idle_resume_us.

The file's encoding is inverted at 0: reading or writing "0" means *no constraint*, while "n/a"
means a bound of 0 us (only polling idle). So a requested bound of 0 us is written as "n/a".
Originals are kept as the raw text read, and written back verbatim.

A layer's bound applies to the CPUs the layer owns. Open layers own no CPUs, and bounding every
CPU of the host would keep all of them polling when idle (on a VM: CPU time taken from the host
for nothing), so the daemon does not apply idle_resume_us for them. NativeBackend's
pmqos_open_layers=True, which the daemon never passes (temperd.toml has no such key), bounds
every online CPU for them instead.
"""

from __future__ import annotations

import os
from typing import Callable, Dict, FrozenSet, List, Mapping, Optional, Tuple

from temperd.backends.native.held import HeldSettings, Setting
from temperd.backends.result import ApplyResult
from temperd.plan import LayerPlan

PMQOS = "pmqos"
CPU_ROOT = "/sys/devices/system/cpu"
ZERO_LATENCY = "n/a"


def encode(resume_us: int) -> str:
    if resume_us < 0:
        raise ValueError(f"idle_resume_us must be >= 0, found {resume_us}")
    return ZERO_LATENCY if resume_us == 0 else str(resume_us)


def resume_bounds(plan: LayerPlan, online: FrozenSet[int], open_layers: bool) -> Tuple[Dict[int, int], List[str]]:
    """The bound each CPU should have (cpu -> us, the tightest of its layers) and notes on the
    layers whose bound is not applied."""
    bounds: Dict[int, int] = {}
    notes: List[str] = []
    for layer in plan.layers:
        if layer.idle_resume_us is None:
            continue
        if layer.cpus:
            cpus = frozenset(layer.cpus) & online
        elif open_layers:
            cpus = online
        else:
            notes.append(f"layer {layer.name}: idle_resume_us {layer.idle_resume_us} not applied: an Open layer "
                         "owns no CPUs, and temperd does not bound every CPU of the host for one")
            continue
        for cpu in cpus:
            bounds[cpu] = min(bounds.get(cpu, layer.idle_resume_us), layer.idle_resume_us)
    return bounds, notes


class ResumeLatencyFile(Setting[int, str]):
    """One CPU's pm_qos_resume_latency_us, as raw text."""

    kind = PMQOS

    def __init__(self, cpu_root: str = CPU_ROOT):
        self.cpu_root = cpu_root

    def path(self, cpu: int) -> str:
        return os.path.join(self.cpu_root, f"cpu{cpu}", "power", "pm_qos_resume_latency_us")

    def read(self, cpu: int) -> Optional[str]:
        try:
            with open(self.path(cpu)) as handle:
                return handle.read().strip()
        except FileNotFoundError:
            return None  # the CPU went away (hot-unplugged)

    def write(self, cpu: int, text: str) -> None:
        with open(self.path(cpu), "w") as handle:
            handle.write(text)

    def where(self, cpu: int) -> str:
        return self.path(cpu)

    def key_from_text(self, text: str) -> int:
        return int(text)


class PmQos(HeldSettings[int, str]):
    """Holds resume bounds on CPUs: each CPU's original is recorded before the first write."""

    def __init__(self, cpu_root: str = CPU_ROOT):
        super().__init__(ResumeLatencyFile(cpu_root))

    def read(self, cpu: int) -> Optional[str]:
        """The CPU's bound as the file shows it; None when it cannot be read."""
        try:
            return self.setting.read(cpu)
        except OSError:
            return None

    def supported(self, cpu: int) -> Tuple[bool, str]:
        path = self.setting.path(cpu)
        if not os.path.exists(path):
            return False, f"{path} does not exist: this kernel or platform exposes no per-CPU resume latency QoS"
        if not os.access(path, os.W_OK):
            return False, f"{path} is not writable"
        return True, ""

    def apply(self, desired: Mapping[int, int],
              before_write: Optional[Callable[[], None]] = None) -> ApplyResult:
        """Make the bounds in `desired` (cpu -> us) hold and restore CPUs no longer in it."""
        wanted: Dict[int, str] = {}
        unsupported: List[str] = []
        for cpu in sorted(desired):
            ok, why = (True, "") if cpu in self.drifted else self.supported(cpu)
            if ok:
                wanted[cpu] = encode(desired[cpu])
            else:
                unsupported.append(why)
        result = self.hold(wanted, before_write)
        result.unsupported.extend(unsupported)
        return result
