"""The host's idle CPU time (idle + iowait of every CPU, /proc/stat through psutil): whether CPU
was to be had while a thread waited for one."""

from __future__ import annotations

import psutil


def idle_seconds() -> float:
    """Seconds every online CPU together spent idle (or idle waiting on I/O) since boot."""
    times = psutil.cpu_times()
    return times.idle + getattr(times, "iowait", 0.0)
