"""Reading a cgroup's CPU quota, cpuset, throttling and memory use, on cgroup v2, hybrid and v1 hosts."""

from __future__ import annotations

import os
from typing import FrozenSet, Optional, Tuple

from temperd.files import kernel_lines, read_stripped

CGROUP_ROOT = "/sys/fs/cgroup"


def v2_root(root: str = CGROUP_ROOT) -> str:
    """Where the cgroup v2 tree is mounted: unified/ on hybrid hosts, else the root itself."""
    unified = os.path.join(root, "unified")
    return unified if os.path.isdir(unified) else root


def cpu_quota(cgroup: str, root: str = CGROUP_ROOT) -> Optional[float]:
    """The CPU budget (in CPUs) a cgroup's quota allows, or None when unlimited or unknown.

    cgroup v2 writes "max 100000" or "<quota> <period>" in cpu.max (at the root on unified
    hosts, under unified/ on hybrid ones); v1 has cpu.cfs_quota_us (-1 = none) and cpu.cfs_period_us.
    """
    rel = cgroup.lstrip("/")
    for base in (root, os.path.join(root, "unified")):
        text = read_stripped(os.path.join(base, rel, "cpu.max"))
        if text:
            quota, _, period = text.partition(" ")
            if quota == "max":
                return None
            try:
                return int(quota) / int(period or "100000")
            except ValueError:
                return None
    for controller in ("cpu", "cpu,cpuacct"):
        quota = read_stripped(os.path.join(root, controller, rel, "cpu.cfs_quota_us"))
        period = read_stripped(os.path.join(root, controller, rel, "cpu.cfs_period_us"))
        if quota and period:
            try:
                q, p = int(quota), int(period)
            except ValueError:
                return None
            return q / p if q > 0 and p > 0 else None
    return None


def v2_dir(cgroup: str, root: str = CGROUP_ROOT) -> Optional[str]:
    """The directory of a cgroup v2 path: under the root on unified hosts, under unified/ on
    hybrid ones; None where neither has it."""
    rel = cgroup.lstrip("/")
    for base in (root, os.path.join(root, "unified")):
        directory = os.path.join(base, rel)
        if os.path.exists(os.path.join(directory, "cgroup.procs")) and os.path.exists(
                os.path.join(base, "cgroup.controllers")):
            return directory
    return None


def _v1_file(cgroup: str, controller: str, name: str, root: str) -> Optional[str]:
    """A v1 controller's file for the same path (systemd keeps the hierarchies' paths alike)."""
    text = read_stripped(os.path.join(root, controller, cgroup.lstrip("/"), name))
    return text if text else None


def _keyed(text: Optional[str]) -> dict:
    out = {}
    for line in kernel_lines(text or ""):
        key, _, value = line.partition(" ")
        try:
            out[key] = int(value)
        except ValueError:
            continue
    return out


def cpuset_cpus(cgroup: str, root: str = CGROUP_ROOT) -> Optional[str]:
    """The cpuset the cgroup itself sets (AllowedCPUs=, cpuset.cpus), as a CPU list; None where it
    sets none (v2: an empty cpuset.cpus inherits; v1 copies the parent's, which is left to the caller)."""
    directory = v2_dir(cgroup, root)
    if directory is not None:
        text = read_stripped(os.path.join(directory, "cpuset.cpus"))
        if text:
            return text
    return _v1_file(cgroup, "cpuset", "cpuset.cpus", root)


def throttling(cgroup: str, root: str = CGROUP_ROOT) -> Optional[Tuple[int, int, float]]:
    """(nr_periods, nr_throttled, throttled seconds) from cpu.stat (v2, or the v1 cpu controller);
    None where the CPU controller does not count them for this cgroup."""
    directory = v2_dir(cgroup, root)
    if directory is not None:
        stat = _keyed(read_stripped(os.path.join(directory, "cpu.stat")))
        if "nr_throttled" in stat:
            return stat.get("nr_periods", 0), stat["nr_throttled"], stat.get("throttled_usec", 0) / 1e6
    for controller in ("cpu", "cpu,cpuacct"):
        stat = _keyed(_v1_file(cgroup, controller, "cpu.stat", root))
        if "nr_throttled" in stat:
            return stat.get("nr_periods", 0), stat["nr_throttled"], stat.get("throttled_time", 0) / 1e9
    return None


UNLIMITED_BYTES = 1 << 60  # v1 reports "no limit" as a huge page-aligned number


def memory_use(cgroup: str, root: str = CGROUP_ROOT) -> Optional[Tuple[int, Optional[int]]]:
    """(bytes in use, the tightest limit: memory.high or memory.max on v2, limit_in_bytes on v1;
    None when unlimited); None where no memory controller counts this cgroup."""
    directory = v2_dir(cgroup, root)
    if directory is not None:
        current = read_stripped(os.path.join(directory, "memory.current"))
        if current and current.isdigit():
            limits = [read_stripped(os.path.join(directory, name)) for name in ("memory.high", "memory.max")]
            numbers = [int(v) for v in limits if v and v.isdigit()]
            return int(current), min(numbers) if numbers else None
    usage = _v1_file(cgroup, "memory", "memory.usage_in_bytes", root)
    limit = _v1_file(cgroup, "memory", "memory.limit_in_bytes", root)
    if usage and usage.isdigit():
        bound = int(limit) if limit and limit.isdigit() and int(limit) < UNLIMITED_BYTES else None
        return int(usage), bound
    return None


def cpu_usage_us(cgroup: str, root: str = CGROUP_ROOT) -> Optional[int]:
    """CPU time of every task in the cgroup so far, in microseconds (cpu.stat usage_usec, which
    cgroup v2 keeps with or without the cpu controller); None where there is none."""
    directory = v2_dir(cgroup, root)
    if directory is None:
        return None
    return _keyed(read_stripped(os.path.join(directory, "cpu.stat"))).get("usage_usec")


def procs(cgroup: str, root: str = CGROUP_ROOT) -> Optional[FrozenSet[int]]:
    """The processes in a cgroup v2 cgroup itself (cgroup.procs, not its children); None where the
    cgroup v2 tree has no such cgroup."""
    directory = v2_dir(cgroup, root)
    if directory is None:
        return None
    text = read_stripped(os.path.join(directory, "cgroup.procs"))
    if text is None:
        return None
    return frozenset(int(line) for line in text.split() if line.isdigit())
