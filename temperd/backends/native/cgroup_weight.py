"""Tier weights between workloads: cgroup v2 cpu.weight of each workload's unit or cgroup.

Who may write a cgroup decides how:
- systemd is PID 1: systemd owns the cgroup tree and rewrites attributes it manages, so the
  weight is asked of systemd (`systemctl set-property --runtime UNIT CPUWeight=N`, gone at reboot);
- no systemd: the cgroup's cpu.weight is written directly, when the cgroup2 hierarchy carries
  the cpu controller and the cgroup has the file;
- otherwise the weight is unsupported here, and the reason says why (no cgroup2 mount, cpu
  controller bound to a cgroup v1 hierarchy, controller not enabled for the parent, no unit).

Each weight is a held setting (held.py): the original is recorded before the first change, a
weight someone else changed is theirs (drift), and restore_all() puts the originals back.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from temperd.sources.mounts import cgroup1_cpu_mount, cgroup2_mount
from temperd.backends.native.held import HeldSettings, Refused, Setting
from temperd.backends.result import ApplyResult
from temperd.files import read_stripped
from temperd.plan import CgroupWeight
from temperd.sources.facts import unit_from_cgroup

CPU_WEIGHT = "cpu_weight"
SYSTEMD = "systemd"
CGROUPFS = "cgroupfs"
WEIGHT_MIN, WEIGHT_MAX = 1, 10000
DEFAULT_WEIGHT = 100  # cgroup v2's default: what an empty value ("not set") writes to cpu.weight
_UNSET = ("", "[not set]", "18446744073709551615")  # systemctl's ways of saying "default"

Runner = Callable[[Sequence[str]], Tuple[int, str, str]]


def run_command(argv: Sequence[str]) -> Tuple[int, str, str]:
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 127, "", str(exc)
    return proc.returncode, proc.stdout, proc.stderr


@dataclass(frozen=True)
class WeightSupport:
    method: Optional[str]  # SYSTEMD | CGROUPFS | None (unsupported)
    cgroup2_mount: Optional[str]
    reason: str


def systemd_is_pid1(proc_root: str = "/proc", run_root: str = "/run") -> bool:
    """sd_booted(): /run/systemd/system exists only when systemd is the init system."""
    if not os.path.isdir(os.path.join(run_root, "systemd", "system")):
        return False
    try:
        with open(os.path.join(proc_root, "1", "comm")) as handle:
            return handle.read().strip() == "systemd"
    except OSError:
        return False


def detect(proc_root: str = "/proc", run_root: str = "/run") -> WeightSupport:
    mountinfo = os.path.join(proc_root, "self", "mountinfo")
    mount = cgroup2_mount(mountinfo)
    if systemd_is_pid1(proc_root, run_root):
        return WeightSupport(SYSTEMD, mount, "systemd is PID 1: weights are set with systemctl set-property --runtime")
    init = read_stripped(os.path.join(proc_root, "1", "comm")) or "unknown"
    if mount is None:
        return WeightSupport(None, None, f"no cgroup2 hierarchy is mounted, and PID 1 is {init!r}, not systemd")
    controllers = (read_stripped(os.path.join(mount, "cgroup.controllers")) or "").split()
    if "cpu" not in controllers:
        v1 = cgroup1_cpu_mount(mountinfo)
        where = f"cpu is bound to the cgroup v1 hierarchy at {v1}" if v1 else "cpu is not available to it"
        return WeightSupport(None, mount, (
            f"the cgroup2 hierarchy at {mount} has no cpu controller (controllers: {' '.join(controllers) or 'none'}): "
            f"{where}; PID 1 is {init!r}, not systemd"))
    return WeightSupport(CGROUPFS, mount, f"PID 1 is {init!r}, not systemd: cpu.weight is written under {mount}")


class CpuWeight(Setting[str, str]):
    """cpu.weight behind a key 'systemd:UNIT' (asked of systemd) or 'cgroupfs:/path/cpu.weight'.

    The value is the weight as text; "" is systemd's "not set" (the default weight)."""

    kind = CPU_WEIGHT

    def __init__(self, run: Runner = run_command):
        self.run = run

    def read(self, key: str) -> Optional[str]:
        method, _, target = key.partition(":")
        if method == SYSTEMD:
            code, out, err = self.run(["systemctl", "show", "--property=CPUWeight", "--value", target])
            if code != 0:
                raise Refused(err.strip() or f"systemctl exited {code}")
            value = out.strip()
            return "" if value in _UNSET else value
        try:
            with open(target) as handle:
                return handle.read().strip()
        except FileNotFoundError:
            return None  # the cgroup is gone

    def write(self, key: str, value: str) -> None:
        method, _, target = key.partition(":")
        if method == SYSTEMD:
            code, _out, err = self.run(["systemctl", "set-property", "--runtime", target, f"CPUWeight={value}"])
            if code != 0:
                raise Refused(err.strip() or f"systemctl exited {code}")
            return
        with open(target, "w") as handle:
            handle.write(value or str(DEFAULT_WEIGHT))

    def shown(self, value: str) -> str:
        return f"CPUWeight={value}" if value else "the default CPUWeight"


class CgroupWeights(HeldSettings[str, str]):
    """Holds plan.cgroup_weights, keyed 'systemd:UNIT' or 'cgroupfs:/path/cpu.weight'."""

    def __init__(self, support: Optional[WeightSupport] = None, run: Runner = run_command):
        self.support = support if support is not None else detect()
        self._targets: Dict[CgroupWeight, Tuple[Optional[str], str]] = {}  # the last apply's, by weight
        super().__init__(CpuWeight(run))

    def _target(self, weight: CgroupWeight) -> Tuple[Optional[str], str]:
        """The key of what to write for a CgroupWeight, or None and why not."""
        method = self.support.method
        if method is None:
            return None, f"cpu.weight for {weight.workload}: unsupported: {self.support.reason}"
        if method == SYSTEMD:
            unit = weight.unit or unit_from_cgroup(weight.cgroup)
            if not unit:
                return None, f"cpu.weight for {weight.workload}: no systemd unit to ask systemd about"
            return f"{SYSTEMD}:{unit}", ""
        if not weight.cgroup or weight.cgroup == "/":
            return None, f"cpu.weight for {weight.workload}: the workload has no cgroup of its own"
        path = os.path.join(self.support.cgroup2_mount, weight.cgroup.lstrip("/"), "cpu.weight")
        if not os.path.exists(path):
            parent = os.path.dirname(os.path.dirname(path))
            return None, (f"cpu.weight for {weight.workload}: {path} does not exist "
                          f"(cpu controller not enabled in {parent}/cgroup.subtree_control)")
        return f"{CGROUPFS}:{path}", ""

    def apply(self, weights: Iterable[CgroupWeight], before_write: Optional[Callable[[], None]] = None,
              verify: bool = True, changes: Optional[Tuple[Sequence[CgroupWeight], Sequence[CgroupWeight]]] = None
              ) -> ApplyResult:
        """Make these weights hold and restore the ones no longer asked for. verify False
        (between whole applies, where a workload came or went): a weight the last apply also
        asked for is neither looked up nor read again (a systemctl call or a file read per
        workload, at every batch of a process churn); only the new ones are. changes: (the
        weights gone since the last apply, those new), where the caller knows them."""
        if changes is not None and not verify:
            result = self._apply_changes(*changes)
            if result is not None:
                return result
        desired: Dict[str, str] = {}
        unsupported: List[str] = []
        targets: Dict[CgroupWeight, Tuple[Optional[str], str]] = {}
        trusted = set()
        for weight in weights:
            found = None if verify else self._targets.get(weight)
            if found is None:
                found = self._target(weight)
            else:
                trusted.add(found[0])
            targets[weight] = found
            key, why = found
            if key is None:
                unsupported.append(why)
                continue
            desired[key] = str(max(WEIGHT_MIN, min(WEIGHT_MAX, int(weight.weight))))
        self._targets = targets
        result = self.hold(desired, before_write, trusted)
        result.unsupported.extend(unsupported)
        return result

    def _apply_changes(self, gone: Sequence[CgroupWeight], new: Sequence[CgroupWeight]) -> Optional[ApplyResult]:
        """Where no weight that came or went is one this host can hold (a churn of processes
        without a cgroup of their own: every weight unsupported), nothing held changes: only
        those are looked at, not every workload's. None where one can be held: apply() then
        compares them all."""
        old = [self._targets.get(weight) for weight in gone]
        found = [self._target(weight) for weight in new]
        if any(target is None or target[0] is not None for target in old) or any(key is not None for key, _ in found):
            return None
        for weight in gone:
            del self._targets[weight]
        self._targets.update(zip(new, found))
        result = ApplyResult()
        result.unsupported.extend(why for _key, why in found)
        return result

