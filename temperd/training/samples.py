"""Per-thread /proc samples of one workload while it is trained: once a second, every thread of
every process of the workload (a process and its descendants, or a systemd unit's processes):
name, state, time on a CPU and on a runqueue (schedstat); and each process's name, title,
executable, unit and cgroup.

What the sampler gathers is plain data (JSON in the daemon's reply); the analysis reads it with
the parsed trace. Reading /proc is the only I/O here.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from temperd.sources import procfs
from temperd.sources.cgroups import cpu_quota

SAMPLE_INTERVAL_S = 1.0


@dataclass
class ThreadSample:
    t: float  # seconds since the sampler started
    state: str
    run_ns: int  # schedstat: on a CPU, since the thread started
    wait_ns: int  # schedstat: runnable on a runqueue, since the thread started


@dataclass
class ThreadSeries:
    tid: int
    pid: int
    comm: str
    samples: List[ThreadSample] = field(default_factory=list)


@dataclass
class ProcessInfo:
    pid: int
    ppid: int
    name: str
    exe: Optional[str]
    titles: List[str]  # the process title (cmdline joined) at each sample where it changed
    unit: Optional[str]
    cgroup: Optional[str]
    cpu_quota: Optional[float]  # CPUs of its cgroup's CPU quota, None without one


@dataclass
class Samples:
    root_pid: Optional[int]
    unit: Optional[str]
    interval_s: float
    duration_s: float = 0.0
    processes: Dict[int, ProcessInfo] = field(default_factory=dict)
    threads: Dict[int, ThreadSeries] = field(default_factory=dict)


def workload_pids(root_pid: Optional[int], unit: Optional[str]) -> List[int]:
    """The processes of the workload now: root_pid and its descendants, or the unit's processes."""
    if unit:
        from temperd.trace.capture import unit_pids

        return unit_pids(unit)
    if root_pid is None:
        return []
    return [pid for pid in procfs.process_tree(root_pid) if os.path.isdir(f"{procfs.PROC}/{pid}")]


class Sampler:
    """Samples the workload every `interval_s` on a thread of its own until stop()."""

    def __init__(self, root_pid: Optional[int], unit: Optional[str], interval_s: float = SAMPLE_INTERVAL_S):
        self.samples = Samples(root_pid, unit, interval_s)
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._started = 0.0

    def start(self) -> None:
        self._started = time.monotonic()
        self.sample_once()
        self._thread = threading.Thread(target=self._run, name="train-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.samples.interval_s):
            self.sample_once()

    def stop(self) -> Samples:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sample_once()
        self.samples.duration_s = round(time.monotonic() - self._started, 3)
        return self.samples

    def sample_once(self) -> None:
        now = round(time.monotonic() - self._started, 3)
        for pid in workload_pids(self.samples.root_pid, self.samples.unit):
            stats = procfs.read_thread_stats(pid)
            if not stats:
                continue
            if stats.get(pid) is not None and procfs.is_kernel_thread(pid, stats[pid]):
                continue
            self._process(pid, stats.get(pid))
            for tid, stat in stats.items():
                sched = procfs.read_schedstat(pid, tid)
                if sched is None:
                    continue
                series = self.samples.threads.get(tid)
                if series is None or series.pid != pid:
                    series = self.samples.threads[tid] = ThreadSeries(tid, pid, stat.comm)
                series.comm = stat.comm
                series.samples.append(ThreadSample(now, stat.state, sched[0], sched[1]))

    def _process(self, pid: int, stat) -> None:
        title = " ".join(procfs.read_cmdline(pid) or ())
        info = self.samples.processes.get(pid)
        if info is not None:
            if title and title != info.titles[-1]:
                info.titles.append(title)
            return
        cgroup = procfs.read_cgroup(pid)
        path = (cgroup.unified or cgroup.systemd) if cgroup else None
        self.samples.processes[pid] = ProcessInfo(
            pid=pid, ppid=stat.ppid if stat else 0, name=stat.comm if stat else "", exe=procfs.read_exe(pid),
            titles=[title], unit=cgroup.unit if cgroup else None, cgroup=path,
            cpu_quota=cpu_quota(path) if path else None)
