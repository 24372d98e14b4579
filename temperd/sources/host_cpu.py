"""/proc/stat, the host's CPU times: the whole host's (a trial's idle and steal), each online
CPU's idle time by number (whether CPU was to be had, where a thread may run, while it waited for
one) and when the host booted. The one reader of the file."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

from temperd.files import kernel_lines
from temperd.sources.procfs import CLOCK_TICKS, PROC, read_file

IDLE, IOWAIT = 3, 4  # positions in a cpu line's times


@dataclass(frozen=True)
class HostStat:
    total: Tuple[int, ...]  # the `cpu` line: user nice system idle iowait irq softirq steal (ticks)
    per_cpu: Dict[int, Tuple[int, ...]]  # each online CPU's line, by CPU number
    boot_time: float  # btime: seconds since the epoch; 0 where the file has none


def parse_stat(data: bytes) -> HostStat:
    total: Tuple[int, ...] = ()
    per_cpu: Dict[int, Tuple[int, ...]] = {}
    boot_time = 0.0
    for line in kernel_lines(data):
        if line.startswith(b"cpu"):
            fields = line.split()
            times = tuple(int(x) for x in fields[1:9])
            name = fields[0][3:]
            if not name:
                total = times
            elif name.isdigit():
                per_cpu[int(name)] = times
        elif line.startswith(b"btime "):
            boot_time = float(line.split()[1])
    return HostStat(total, per_cpu, boot_time)


def read_stat() -> HostStat:
    return parse_stat(read_file(f"{PROC}/stat", 65536))


def idle_seconds(stat: HostStat) -> List[float]:
    """Indexed by CPU number, the seconds each CPU spent idle (or idle waiting on I/O) since boot;
    0 for a CPU that is not online."""
    size = max(stat.per_cpu, default=-1) + 1
    return [(stat.per_cpu[cpu][IDLE] + stat.per_cpu[cpu][IOWAIT]) / CLOCK_TICKS if cpu in stat.per_cpu else 0.0
            for cpu in range(size)]


class IdleShares:
    """Each CPU's share of the time since the previous call that it sat idle, by CPU number:
    idle_seconds read as a window. None at the first call, or where CPUs came or went between."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._mark: Optional[Tuple[List[float], float]] = None  # (idle seconds per CPU, clock) at the last call

    def __call__(self) -> Optional[List[float]]:
        idle, at = idle_seconds(read_stat()), self._clock()
        before, self._mark = self._mark, (idle, at)
        if before is None or at <= before[1] or len(before[0]) != len(idle):
            return None
        return [max(0.0, min(1.0, (now - then) / (at - before[1]))) for now, then in zip(idle, before[0])]
