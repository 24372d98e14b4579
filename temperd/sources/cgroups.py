"""Reading a cgroup's CPU quota, on cgroup v2, hybrid and v1 hosts."""

from __future__ import annotations

import os
from typing import Optional

from temperd.files import read_stripped

CGROUP_ROOT = "/sys/fs/cgroup"


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

