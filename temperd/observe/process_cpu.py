"""Each process's CPU ticks (utime + stime) for an observation sample, without the kernel's walk
of every thread of a process where none of them can have run.

/proc/PID/stat sums the times of every thread of the process: for one of 20 000 threads that
read costs the kernel ~5 ms, most of a sample. A process whose last read showed MANY_THREADS or
more is read again only when its cgroup's CPU time (cgroup v2 cpu.stat usage_usec, which counts
every task in the cgroup and below it) moved since the read before it. The cgroup is read from
/proc/PID/cgroup each time (a move is no event), and a process in a threaded cgroup, whose
threads may sit in sibling cgroups, is always read. Where the cgroup cannot vouch (the root, which
counts the whole host: a host without a cgroup per service), such a process that has no thread
in the plan and did not run at its last read is read every STILL_EVERY-th sample: until then it
counts as still, and the read that finds it running spreads its CPU over the time since the read
before.
"""

from __future__ import annotations

import os
import time
from typing import Callable, Container, Dict, Mapping, NamedTuple, Optional, Tuple

from temperd.files import read_stripped
from temperd.sources import cgroups, procfs

MANY_THREADS = 64  # below this, the stat read costs less than the cgroup's two reads
STILL_EVERY = 6  # a still many-threaded process outside the plan: read every 6th sample (30 s)


class _Read(NamedTuple):
    """What the last read of a process said, and its cgroup's CPU time read just before it."""

    start_time: int
    ticks: int
    cgroup: Optional[str]  # None: not gated (few threads, no cgroup v2 path, a threaded cgroup)
    usage_us: Optional[int]
    at: float  # when it was read (monotonic seconds)
    still: int = 0  # samples since, while it counted as still; -1: it ran at that read


def domain_usage_us(cgroup: str, root: str = cgroups.CGROUP_ROOT) -> Optional[int]:
    """The cgroup's CPU time, where every thread of a process in it is counted there; None in a
    threaded cgroup (its process's threads may be in its siblings) or where there is none."""
    directory = cgroups.v2_dir(cgroup, root)
    if directory is None or read_stripped(os.path.join(directory, "cgroup.type")) == "threaded":
        return None
    return cgroups.cpu_usage_us(cgroup, root)


def _unified_cgroup(pid: int) -> Optional[str]:
    paths = procfs.read_cgroup(pid)
    return paths.unified if paths is not None else None


class ProcessTicks:
    """utime + stime of each process, sample after sample (the observer's)."""

    def __init__(self, usage_us: Callable[[str], Optional[int]] = domain_usage_us,
                 cgroup_of: Callable[[int], Optional[str]] = _unified_cgroup):
        self._usage_us = usage_us
        self._cgroup_of = cgroup_of
        self._last: Dict[int, _Read] = {}
        self.skipped = 0  # reads saved: the process's cgroup had not run

    def read(self, processes: Mapping[int, object], planned: Container[int] = (),
             now: Optional[float] = None) -> Dict[int, Tuple[int, Optional[float]]]:
        """pid -> (ticks, CPUs used since the read before; None at the first) of every process
        still there (kernel threads left out); planned: the processes with a thread in the plan."""
        now = time.monotonic() if now is None else now
        usage_now: Dict[str, Optional[int]] = {}  # each cgroup read once a sample

        def usage(cgroup: str) -> Optional[int]:
            if cgroup not in usage_now:
                usage_now[cgroup] = self._usage_us(cgroup)
            return usage_now[cgroup]

        last, kept, out = self._last, {}, {}
        for pid, proc in processes.items():
            if getattr(proc, "is_kernel_thread", False):
                continue
            before = last.get(pid)
            cgroup = used = None
            if before is not None and getattr(proc, "start_time", before.start_time) != before.start_time:
                before = None  # the pid is another process's
            if before is not None and before.cgroup is not None:
                cgroup = self._cgroup_of(pid)
                used = usage(cgroup) if cgroup is not None else None
                vouched = cgroup == before.cgroup and used is not None and used == before.usage_us
                mute = cgroup in (None, "/") and 0 <= before.still < STILL_EVERY - 1 and pid not in planned
                if vouched or mute:
                    kept[pid] = before if vouched else before._replace(still=before.still + 1)
                    out[pid] = (before.ticks, 0.0)
                    self.skipped += 1
                    continue
            stat = procfs.read_process_stat(pid)  # after the cgroup's usage: a run between the two shows next time
            if stat is None:
                continue
            if stat.num_threads < MANY_THREADS:
                cgroup = used = None
            elif before is None or before.cgroup is None:
                cgroup = self._cgroup_of(pid) or None
                used = None  # read after the stat: not to be trusted, so the next sample reads again
            ran = before is None or stat.cpu_ticks != before.ticks
            kept[pid] = _Read(stat.start_time, stat.cpu_ticks, cgroup, used, now, -1 if ran else 0)
            out[pid] = (stat.cpu_ticks, None if before is None or now <= before.at else
                        (stat.cpu_ticks - before.ticks) / procfs.CLOCK_TICKS / (now - before.at))
        self._last = kept
        return out
