"""Per-CPU idle-resume bound: /sys/devices/system/cpu/cpuN/power/pm_qos_resume_latency_us.

The cpuidle governor keeps a CPU out of idle states whose exit latency exceeds the bound, so a
wakeup on that CPU does not first pay for leaving a deep state (on a KVM guest: a halted vCPU
that the host must reschedule). The native counterpart of scx_layered's idle_resume_us.

The file's encoding is inverted at 0: reading or writing "0" means *no constraint*, while "n/a"
means a bound of 0 us (only polling idle). So a requested bound of 0 us is written as "n/a".
Originals are kept as the raw text read, and written back verbatim.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Tuple

CPU_ROOT = "/sys/devices/system/cpu"
NO_CONSTRAINT = "0"
ZERO_LATENCY = "n/a"


def encode(resume_us: int) -> str:
    if resume_us < 0:
        raise ValueError(f"idle_resume_us must be >= 0, found {resume_us}")
    return ZERO_LATENCY if resume_us == 0 else str(resume_us)


@dataclass
class HostSettingResult:
    """What one apply or restore of a host-wide setting (PM QoS bound, cgroup weight) did."""

    applied: int = 0
    restored: int = 0
    failed: int = 0
    drift: int = 0
    errors: List[str] = field(default_factory=list)
    unsupported: List[str] = field(default_factory=list)


class PmQos:
    """Sets bounds on CPUs, remembers each CPU's original before the first write, restores them."""

    def __init__(self, cpu_root: str = CPU_ROOT):
        self.cpu_root = cpu_root
        self.originals: Dict[int, str] = {}  # cpu -> raw text before temperd wrote
        self.written: Dict[int, str] = {}  # cpu -> raw text temperd wrote
        self.drifted: Dict[int, str] = {}  # cpu -> what someone else wrote over ours

    def path(self, cpu: int) -> str:
        return os.path.join(self.cpu_root, f"cpu{cpu}", "power", "pm_qos_resume_latency_us")

    def supported(self, cpu: int) -> Tuple[bool, str]:
        path = self.path(cpu)
        if not os.path.exists(path):
            return False, f"{path} does not exist: this kernel or platform exposes no per-CPU resume latency QoS"
        if not os.access(path, os.W_OK):
            return False, f"{path} is not writable"
        return True, ""

    def read(self, cpu: int) -> Optional[str]:
        try:
            with open(self.path(cpu)) as handle:
                return handle.read().strip()
        except OSError:
            return None

    def _write(self, cpu: int, text: str) -> None:
        with open(self.path(cpu), "w") as handle:
            handle.write(text)

    def apply(self, desired: Mapping[int, int]) -> HostSettingResult:
        """Make the bounds in `desired` (cpu -> us) hold and restore CPUs no longer in it."""
        result = HostSettingResult()
        for cpu in sorted(set(self.written) - set(desired)):
            self._restore_one(cpu, result)
        for cpu in sorted(desired):
            want = encode(desired[cpu])
            if cpu in self.drifted:
                continue
            ok, why = self.supported(cpu)
            if not ok:
                result.unsupported.append(why)
                continue
            current = self.read(cpu)
            if cpu in self.written:
                if current != self.written[cpu]:
                    # Someone else wrote this CPU's bound: count it and leave it theirs.
                    self.drifted[cpu] = current or ""
                    result.drift += 1
                    continue
                if current == want:
                    continue
            elif current is None:
                result.failed += 1
                result.errors.append(f"cpu{cpu}: cannot read {self.path(cpu)}")
                continue
            else:
                self.originals.setdefault(cpu, current)
            try:
                self._write(cpu, want)
            except OSError as exc:
                result.failed += 1
                result.errors.append(f"cpu{cpu}: writing {want!r} to {self.path(cpu)}: {exc.strerror}")
                continue
            self.written[cpu] = want
            result.applied += 1
        return result

    def _restore_one(self, cpu: int, result: HostSettingResult) -> None:
        original = self.originals.get(cpu)
        written = self.written.get(cpu)
        # A bound someone else wrote over ours is theirs: leave it.
        drifted = cpu in self.drifted or (written is not None and self.read(cpu) not in (written, None))
        self.written.pop(cpu, None)
        self.drifted.pop(cpu, None)
        self.originals.pop(cpu, None)
        if original is None or drifted:
            return
        try:
            self._write(cpu, original)
            result.restored += 1
        except OSError as exc:
            if exc.errno == errno.ENOENT:  # CPU went away (hot-unplugged): nothing to restore
                return
            result.failed += 1
            result.errors.append(f"cpu{cpu}: restoring {original!r} to {self.path(cpu)}: {exc.strerror}")

    def restore_all(self) -> HostSettingResult:
        result = HostSettingResult()
        for cpu in sorted(set(self.originals) | set(self.written)):
            self._restore_one(cpu, result)
        return result

    def adopt(self, originals: Mapping[int, str], written: Mapping[int, str]) -> None:
        """Take over what a previous run wrote (from its state file) so restore_all() undoes it."""
        for cpu, text in originals.items():
            self.originals.setdefault(int(cpu), text)
        for cpu, text in written.items():
            self.written.setdefault(int(cpu), text)
