"""Delay accounting (kernel.task_delayacct): whether the kernel counts each task's block I/O delay
(the delayacct_blkio_ticks of its stat, read by procfs). temperd never switches it on: it
costs every task switch on the host, and that is the operator's choice (sysctl, or the
`delayacct` boot option)."""

from __future__ import annotations

from typing import Tuple

from temperd.files import read_stripped

SYSCTL = "/proc/sys/kernel/task_delayacct"


def delayacct_state(path: str = SYSCTL) -> Tuple[bool, str]:
    """(on, why not) - why is empty when it is on."""
    value = read_stripped(path)
    if value is None:
        return False, "this kernel has no kernel.task_delayacct"
    if value != "1":
        return False, "kernel.task_delayacct is 0 (temperd does not switch it on)"
    return True, ""
