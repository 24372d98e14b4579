"""A task's cumulative counters from /proc/PID/task/TID/stat (or /proc/PID/stat for the whole
process): CPU ticks, its state now, major faults and block I/O delay. One read gives them all;
the usage sampler reads them for the busiest threads of each tracked workload every second."""

from __future__ import annotations

from typing import NamedTuple, Optional

from temperd.sources import procfs


class TaskCounters(NamedTuple):
    state: str  # R, S, D, ... as sampled now
    cpu_ticks: int  # utime + stime (for /proc/PID/stat: every thread of the process, dead ones included)
    major_faults: int
    blkio_ticks: int  # delayacct_blkio_ticks: block I/O delay; 0 unless kernel.task_delayacct is on
    start_time: int  # clock ticks after boot: with the id, the task's identity
    comm: str  # its name now


def parse_counters(data: bytes) -> Optional[TaskCounters]:
    try:
        stat = procfs.parse_stat(data)
    except (ValueError, IndexError):
        return None
    return TaskCounters(stat.state, stat.cpu_ticks, stat.major_faults, stat.blkio_ticks, stat.start_time, stat.comm)


def read_task_counters(pid: int, tid: int) -> Optional[TaskCounters]:
    data = procfs.read_bytes(f"{procfs.PROC}/{pid}/task/{tid}/stat", 2048, single=True)
    return parse_counters(data) if data else None


def read_process_counters(pid: int) -> Optional[TaskCounters]:
    """The whole process (its state is the leader's)."""
    data = procfs.read_bytes(f"{procfs.PROC}/{pid}/stat", 2048, single=True)
    return parse_counters(data) if data else None
