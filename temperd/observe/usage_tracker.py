"""The tracker of the learner's thread (observe/learner.py): what it keeps of each tracked
workload between samples, and one sample or snapshot of one workload. Time comes from an injected
clock (the thread's own interval per kept thread), so a test can drive it.

A sample of a workload in a cgroup of its own starts with its cgroup's CPU time: unchanged, and
nothing else is read. Otherwise it costs one read of /proc/PID/stat per process; only where the
process used CPU since the previous sample are its kept threads (the keep_threads busiest of the
workload) read, one schedstat and one stat each. A workload whose cgroup has used no CPU for
RESTING_AFTER_S is resting (the thread then looks less often; a look counts for the sampling
intervals it covers). Which threads are kept is decided anew every RERANK_S from every thread's
runtime, read only for processes that ran meanwhile.

A thread's usage is what it wants (wanted_cpus): its on-CPU time as a share of the time it was not
kept waiting on a runqueue or by its quota, at most one CPU, while the CPUs it may run on had idle
time; where they had none, what it got where it slept, and where it hardly slept and waited it was
starved (demand()): that interval counts what it got and is marked, so rightsizing never reads a
thread behind on fixed work as a spinner. Classification's window counts what each thread asked
for (wanted_cpus) in every interval: its intensity is the demand, whoever kept it waiting.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Set, Tuple

from temperd.config.daemon_config import LearnerSettings
from temperd.observe import workload_window as W
from temperd.observe.usage_history import ThreadSample, UsageHistory
from temperd.sources import cgroups, nvml, procfs, psi, rapl
from temperd.sources.proc_io import read_process_io
from temperd.sources.procfs import CLOCK_TICKS, read_affinity, read_process_stat, read_task_stat

RERANK_S = 60.0
# A workload whose own cgroup used no CPU for this long rests (module docstring): longer than the idle
# gaps of the duty cycles per-second samples exist to see.
RESTING_AFTER_S = 30.0
SLEEPING = ("S", "D")
# A thread whose CPUs (its affinity) were idle less than HOST_ROOM_CPUS together over an interval, and
# that slept less than STARVED_SLEEP_SHARE of it and waited at least STARVED_WAIT_SHARE on a runqueue, was starved.
STARVED_SLEEP_SHARE = 0.05
STARVED_WAIT_SHARE = 0.10
HOST_ROOM_CPUS = 0.25


@dataclass
class _Thread:
    pid: int
    start_time: int
    comm: str
    group: Optional[str]
    run_ns: int = 0
    wait_ns: int = 0
    blkio_ticks: int = 0
    read_at: float = 0.0  # monotonic time of the last read
    seen: bool = False


@dataclass
class _Process:
    cpu_ticks: int
    at: float
    io: Optional[int] = None
    major_faults: int = 0
    moved_since_rerank: bool = True


@dataclass
class Tracked:
    """One workload as the sampler follows it."""

    label: str
    key: str
    kept: Dict[int, _Thread] = field(default_factory=dict)
    processes: Dict[int, _Process] = field(default_factory=dict)
    counters: W.Counters = field(default_factory=W.Counters)
    window: W.Window = field(default_factory=W.Window)
    reranked_at: float = 0.0
    rerank_runtime: Dict[int, int] = field(default_factory=dict)  # tid -> run ns at the last rerank
    cgroup_usage_us: Optional[int] = None  # its cgroup's cpu.stat usage_usec at the last sample
    sampled_at: Optional[float] = None  # time of the last sample
    unchanged_since: Optional[float] = None  # first sample of the current run that found its cgroup unchanged
    psi_missing: str = ""
    psi_scope: str = ""  # "cgroup /x (its own)": where its pressure was read, for the reason

    @property
    def resting(self) -> bool:
        """Its cgroup unchanged for RESTING_AFTER_S as of the last sample (module docstring)."""
        return (self.unchanged_since is not None and self.sampled_at is not None
                and self.sampled_at - self.unchanged_since >= RESTING_AFTER_S)


def wanted_cpus(ran_s: float, waited_s: float, interval_s: float) -> float:
    """The share of a CPU a thread wants while CPU is to be had: of the time it was not kept
    waiting on a runqueue (or by its quota), the part it ran. A spinning thread wants 1.0; one
    doing 10 ms of work in every 100 ms wants about 0.1 even when each wakeup waits."""
    free = max(ran_s, interval_s - min(waited_s, interval_s))
    return min(1.0, ran_s / free) if free > 0 else 0.0


def demand(ran_s: float, waited_s: float, interval_s: float, room_cpus: Optional[float]) -> Tuple[float, bool]:
    """(the CPUs a thread wanted over an interval, whether it was starved).

    room_cpus: how idle the CPUs it may run on were (its affinity, which its cpuset and temperd's
    plan narrow), on average over the interval; None where unknown. A thread that slept (at least
    STARVED_SLEEP_SHARE of the interval) had run out of work each time: its waits delayed it, they
    did not take CPU it would have used, so it wanted its run share (threads released together
    each period queue behind each other even on a quiet host). One that hardly slept wanted what
    it ran of the time it was not kept waiting (wanted_cpus: a spinner wants 1.0) where its CPUs
    had room (at least HOST_ROOM_CPUS); without room, if it waited at least STARVED_WAIT_SHARE of
    the interval, it was starved: a spinner and a thread behind on fixed work look alike then, so
    its demand is unknown, at least its run share (returned, marked starved)."""
    if interval_s <= 0:
        return 0.0, False
    got = min(1.0, ran_s / interval_s)
    if interval_s - ran_s - waited_s >= STARVED_SLEEP_SHARE * interval_s:
        return got, False
    if room_cpus is None or room_cpus >= HOST_ROOM_CPUS:
        return wanted_cpus(ran_s, waited_s, interval_s), False
    return got, waited_s >= STARVED_WAIT_SHARE * interval_s


def _room(idle_by_cpu: Optional[Sequence[float]], thread: "_Thread", tid: int) -> Optional[float]:
    """How idle the CPUs the thread may run on were; None where unknown."""
    if idle_by_cpu is None:
        return None
    allowed = read_affinity(tid, thread.pid)
    if allowed is None:
        return None
    return sum(idle_by_cpu[cpu] for cpu in allowed if cpu < len(idle_by_cpu))


class UsageTracker:
    """Samples and snapshots tracked workloads into their Tracked state and the usage history."""

    def __init__(self, settings: LearnerSettings, history: UsageHistory, energy: bool,
                 clock: Callable[[], float] = time.monotonic):
        """energy: the host has RAPL energy counters (checked once: hardware does not come and go)."""
        self.settings = settings
        self.history = history
        self.energy = energy
        self.clock = clock

    def intervals(self, t: Tracked, now: float) -> int:
        """How many sampling intervals this look at t covers (more than one after a resting wait)."""
        if t.sampled_at is None:
            return 1
        return max(1, int(round((now - t.sampled_at) / self.settings.sample_interval_s)))

    def sample(self, t: Tracked, w, now: float, idle_by_cpu: Optional[Sequence[float]] = None) -> None:
        """One sample of w into t and the history; idle_by_cpu: each CPU's idle share since the last
        sample (what decides whether a thread that waited was starved)."""
        # Its own cgroup's CPU time unchanged and the same processes: nothing ran, nothing to read
        # (/proc/PID/stat of a process with thousands of threads costs the kernel a walk over them).
        usage = cgroups.cpu_usage_us(w.cgroup) if w.cgroup and w.cgroup != "/" else None
        unchanged = usage is not None and usage == t.cgroup_usage_us and set(w.pids) == set(t.processes)
        t.cgroup_usage_us = usage
        intervals = self.intervals(t, now)
        if not unchanged:
            t.unchanged_since = None
        elif t.unchanged_since is None:  # unchanged since the sample that read the same usage
            t.unchanged_since = t.sampled_at if t.sampled_at is not None else now
        t.sampled_at = now
        if unchanged:  # kept threads or none (a pool that never ran since it was tracked): nothing to read
            if self.settings.rightsizing:
                self.history.of(t.label).record_idle(now, intervals)
            return
        moved, residual, elapsed = self._read_processes(t, w)
        if not moved:  # nothing ran: a zero for every kept thread, counted in one go; no rank can change
            if self.settings.rightsizing:
                self.history.of(t.label).record_idle(now, intervals)
            t.counters.sampled = True
            return
        if now - t.reranked_at >= RERANK_S or len(t.kept) < min(self.settings.keep_threads, len(w.threads)):
            self._rerank(t, w, now)
        dt = elapsed or self.settings.sample_interval_s
        samples, on_cpu, asked_total = self._read_kept(t, set(moved), dt, idle_by_cpu)
        residual = max(0.0, residual - on_cpu)  # what the threads not kept used
        t.counters.demand_s += (asked_total + residual) * dt
        t.counters.used_s += (on_cpu + residual) * dt
        t.counters.sampled = True
        if self.settings.rightsizing:
            self.history.of(t.label).record(now, samples, residual, self.settings.keep_threads, intervals)

    def _read_processes(self, t: Tracked, w) -> Tuple[List[int], float, Optional[float]]:
        """Each process's CPU ticks and major faults since the last sample: (the pids that ran or
        are new, the CPUs they used together, the last interval measured; None: none was)."""
        moved: List[int] = []
        residual = 0.0
        elapsed = None
        for pid in w.pids:
            counters = read_process_stat(pid)
            if counters is None:
                t.processes.pop(pid, None)
                continue
            # Its own interval, as each kept thread has: on a crowded host the sampler runs late
            # by a varying part of a second, and timed by the pass's start a steady process reads
            # more (or less) than it ran, all of it landing in the residual (the threads not kept).
            read_at = self.clock()
            before = t.processes.get(pid)
            if before is None:
                t.processes[pid] = _Process(counters.cpu_ticks, read_at, major_faults=counters.major_faults)
                moved.append(pid)
                continue
            dt = read_at - before.at
            grown = counters.cpu_ticks - before.cpu_ticks
            before.cpu_ticks, before.at = counters.cpu_ticks, read_at
            t.counters.major_faults += max(0, counters.major_faults - before.major_faults)
            before.major_faults = counters.major_faults
            if grown > 0 and dt > 0:
                before.moved_since_rerank = True
                moved.append(pid)
                residual += grown / CLOCK_TICKS / dt
                elapsed = dt
        return moved, residual, elapsed

    def _read_kept(self, t: Tracked, moved: Set[int], dt: float,
                   idle_by_cpu: Optional[Sequence[float]]) -> Tuple[List[ThreadSample], float, float]:
        """A sample of each kept thread (read again only where its process ran): (the samples,
        the CPUs they ran, the CPUs they asked for)."""
        samples = []
        on_cpu = asked_total = 0.0
        for tid, thread in t.kept.items():
            cpus = run_cpus = asked = 0.0
            hungry = False
            if thread.pid in moved:
                read = self._read_kept_thread(t, tid, thread, dt, idle_by_cpu)
                if read is None:
                    continue
                cpus, run_cpus, asked, hungry = read
            on_cpu += run_cpus
            asked_total += asked
            samples.append(ThreadSample(tid, thread.start_time, thread.comm, thread.group, cpus, hungry))
        return samples, on_cpu, asked_total

    def _read_kept_thread(self, t: Tracked, tid: int, thread: _Thread, dt: float,
                          idle_by_cpu: Optional[Sequence[float]]) -> Optional[Tuple[float, float, float, bool]]:
        """One kept thread's schedstat and counters since its last read, into t's counters:
        (CPUs it needed, CPUs it ran, CPUs it asked for, starved); None if it is gone."""
        cpus = run_cpus = asked = 0.0
        hungry = False
        sched = procfs.read_schedstat(thread.pid, tid)
        task = read_task_stat(thread.pid, tid)
        if sched is None or task is None or task.start_time != thread.start_time:
            return None
        read_at = self.clock()  # this thread's own interval: the sampler itself may be delayed
        interval = read_at - thread.read_at
        if thread.seen and interval > 0:
            ran = max(0, sched[0] - thread.run_ns) / 1e9
            waited = max(0, sched[1] - thread.wait_ns) / 1e9
            run_cpus = min(1.0, ran / interval)
            room = _room(idle_by_cpu, thread, tid) if waited >= STARVED_WAIT_SHARE * interval else None
            cpus, hungry = demand(ran, waited, interval, room)
            # Classification reads what the thread asked for (run share of the time it was
            # not kept waiting): a spinner crowded by others is still compute-intense.
            # Rightsizing's history keeps `cpus`, which a starved thread cannot vouch for.
            asked = wanted_cpus(ran, waited, interval)
            t.counters.blkio_ticks += max(0, task.blkio_ticks - thread.blkio_ticks)
        thread.run_ns, thread.wait_ns, thread.blkio_ticks = sched[0], sched[1], task.blkio_ticks
        thread.comm = task.comm  # a thread names itself after it starts
        thread.read_at, thread.seen = read_at, True
        totals = t.counters.threads.setdefault(tid, W.ThreadTotals(pid=thread.pid))
        totals.samples += 1
        if task.state in SLEEPING:
            t.counters.sleep_samples += 1
            if task.state == "D":
                t.counters.d_samples += 1
                totals.d_samples += 1
        totals.demand_s += asked * dt
        return cpus, run_cpus, asked, hungry

    def _rerank(self, t: Tracked, w, now: float) -> None:
        """Keep the busiest threads: runtime since the last rerank, read for processes that ran."""
        groups = {m.tid: (m.pid, m.comm, m.group) for m in w.threads}
        runtime: Dict[int, int] = {}
        for pid, proc in t.processes.items():
            if not proc.moved_since_rerank:
                continue
            proc.moved_since_rerank = False
            for tid, (owner, _comm, _group) in groups.items():
                if owner == pid:
                    sched = procfs.read_schedstat(pid, tid)
                    if sched is not None:
                        runtime[tid] = sched[0]
        grown = {tid: run - t.rerank_runtime.get(tid, 0) for tid, run in runtime.items()}
        t.rerank_runtime = {tid: run for tid, run in {**t.rerank_runtime, **runtime}.items() if tid in groups}
        keep = self.settings.keep_threads
        candidates = sorted(set(grown) | set(t.kept), key=lambda tid: (-grown.get(tid, 0), tid))
        kept: Dict[int, _Thread] = {}
        for tid in candidates:
            if len(kept) >= keep or tid not in groups:
                continue
            if tid in t.kept:
                kept[tid] = t.kept[tid]
                continue
            pid, comm, group = groups[tid]
            task = read_task_stat(pid, tid)
            if task is not None:
                kept[tid] = _Thread(pid, task.start_time, comm, group)
        t.kept = kept
        t.reranked_at = now
        t.counters.threads = {tid: v for tid, v in t.counters.threads.items() if tid in groups}

    def snapshot(self, t: Tracked, w, now: float, host_pressure, gpu: Optional[nvml.GpuReading], own: bool) -> None:
        """Read what the window needs (I/O, pressure, memory, energy, GPU); own: no other process is in its cgroup."""
        readable = False
        for pid in w.pids:
            io = read_process_io(pid)
            proc = t.processes.get(pid)
            if io is None or proc is None:
                continue
            readable = True
            if proc.io is not None:
                t.counters.io_bytes += max(0, io.storage_bytes - proc.io)
            proc.io = io.storage_bytes
        t.counters.io_readable = readable
        # The root cgroup's pressure files are the host's: read once, as host pressure.
        pressure = psi.cgroup_pressure(w.cgroup) if w.cgroup and w.cgroup != "/" else {}
        t.psi_missing = ("" if pressure else "in the root cgroup: no pressure of its own" if w.cgroup == "/"
                         else f"no pressure files for cgroup {w.cgroup or '-'}")
        t.psi_scope = f"cgroup {w.cgroup or '-'} ({'its own' if own else 'shared with other processes'})"
        energy = rapl.read_energy()[0] if self.energy else None
        memory = cgroups.memory_use(w.cgroup) if w.cgroup else None
        used = nvml.workload_gpu(gpu, w.pids) if gpu is not None else None
        t.window.add(W.snapshot(now, t.counters, pressure, host_pressure, memory, energy, own, used),
                     self.settings.window_s)
