"""Each CPU's idle time (idle + iowait, /proc/stat through psutil): whether CPU was to be had,
where a thread may run, while it waited for one."""

from __future__ import annotations

from typing import List

import psutil


def idle_seconds() -> List[float]:
    """Per CPU (by number), the seconds it spent idle (or idle waiting on I/O) since boot."""
    return [t.idle + getattr(t, "iowait", 0.0) for t in psutil.cpu_times(percpu=True)]
