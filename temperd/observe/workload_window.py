"""Classification signals over a sliding window: cumulative counters of one workload, snapshotted
every few seconds, and the differences between the oldest snapshot in the window and the newest
turned into WorkloadSignals (decide/classify.py)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, replace
from typing import Deque, Dict, Mapping, Optional, Tuple

from temperd.decide import classify as C
from temperd.sources.nvml import WorkloadGpu
from temperd.sources.psi import PressureTotals
from temperd.sources.rapl import Energy
from temperd.sources.procfs import CLOCK_TICKS

ACTIVE_THREAD_CPUS = 0.01  # a thread using less than 1 % of a CPU does not count toward capacity
STALLED_THREAD_SHARE = 0.25  # a busy thread sampled in D this often stalls rather than computes
MIN_STATE_SAMPLES = 5


@dataclass
class ThreadTotals:
    demand_s: float = 0.0  # CPU-seconds wanted (usage_tracker.demand x interval)
    d_samples: int = 0
    samples: int = 0
    pid: int = 0  # its process


@dataclass
class Counters:
    """A workload's running totals, kept by the usage sampler."""

    demand_s: float = 0.0
    used_s: float = 0.0
    threads: Dict[int, ThreadTotals] = field(default_factory=dict)
    sleep_samples: int = 0  # kept threads sampled asleep (S or D)
    d_samples: int = 0  # of which in D
    blkio_ticks: int = 0
    io_bytes: int = 0
    major_faults: int = 0
    io_readable: bool = False
    sampled: bool = False


@dataclass
class Snapshot(Counters):
    """The counters at one moment (each thread's copied), with what was read beside them."""

    at: float = 0.0
    psi: Mapping[str, PressureTotals] = field(default_factory=dict)
    host_psi: Mapping[str, PressureTotals] = field(default_factory=dict)
    memory: Optional[Tuple[int, Optional[int]]] = None
    energy: Optional[Energy] = None
    psi_own: bool = False  # psi is of a cgroup no other process shares (else: context only)
    gpu: Optional[WorkloadGpu] = None  # its processes' GPU use since the previous snapshot


def snapshot(at: float, c: Counters, psi, host_psi, memory, energy, psi_own: bool = False,
             gpu: Optional[WorkloadGpu] = None) -> Snapshot:
    return Snapshot(**{**vars(c), "threads": {tid: replace(t) for tid, t in c.threads.items()}}, at=at, psi=dict(psi),
                    host_psi=dict(host_psi), memory=memory, energy=energy, psi_own=psi_own, gpu=gpu)


class Window:
    """The snapshots of one workload that a window of window_s needs."""

    def __init__(self) -> None:
        self.snapshots: Deque[Snapshot] = deque()

    def add(self, snap: Snapshot, window_s: float) -> None:
        self.snapshots.append(snap)
        # keep one snapshot at or before the window's start, so the window is whole
        while len(self.snapshots) > 2 and self.snapshots[1].at <= snap.at - window_s:
            self.snapshots.popleft()

    def span(self, window_s: float) -> Optional[Tuple[Snapshot, Snapshot]]:
        if len(self.snapshots) < 2:
            return None
        last = self.snapshots[-1]
        # The latest snapshot at or before the window's start (else the earliest): a window of
        # window_s covers at least that much once it is full. Snapshots come at SNAPSHOT_S and a
        # little late, so the first one inside it would leave the window a snapshot short for good.
        first = self.snapshots[0]
        for snap in self.snapshots:
            if snap.at > last.at - window_s:
                break
            first = snap
        if first is last:
            first = self.snapshots[-2]
        return first, last


def _pressure_pct(first: Mapping[str, PressureTotals], last: Mapping[str, PressureTotals], resource: str,
                  seconds: float, full: bool = False) -> Optional[float]:
    a, b = first.get(resource), last.get(resource)
    if a is None or b is None:
        return None
    before, after = (a.full_us, b.full_us) if full else (a.some_us, b.some_us)
    if before is None or after is None:
        return None
    return min(100.0, max(0.0, (after - before) / 1e6 / seconds * 100.0))


def signals(label: str, window: Window, *, window_goal_s: float, tier: str, capacity_limit: float,
            hints: C.Hints, missing: Mapping[str, str], delayacct: bool, gpu_present: bool,
            psi_scope: str = "", host_cpus: Optional[float] = None) -> C.WorkloadSignals:
    """The window's WorkloadSignals; measured is empty until two snapshots exist.

    capacity_limit: the declared CPUs where something is declared, else the host's CPUs. The
    cgroup's pressure is the workload's own (PSI_*) only where no snapshot of the window found its
    cgroup shared; else it is context (SHARED_PSI_*). psi_scope names that cgroup for the reason."""
    span = window.span(window_goal_s)
    missing = dict(missing)
    if span is None:
        return C.WorkloadSignals(label, 0.0, window_goal_s, tier, {}, (), missing, hints, gpu_present, psi_scope)
    first, last = span
    seconds = last.at - first.at
    m: Dict[str, float] = {}
    sources = []
    if last.sampled:
        sources.append("schedstat")
        m[C.CPU_DEMAND] = (last.demand_s - first.demand_s) / seconds
        m[C.CPU_USED] = (last.used_s - first.used_s) / seconds
        averages = {}
        by_process: Dict[int, float] = {}
        for tid, t in last.threads.items():
            before = first.threads.get(tid, ThreadTotals(pid=t.pid))
            n = t.samples - before.samples
            stalled = (t.d_samples - before.d_samples) / n if n else 0.0
            averages[tid] = ((t.demand_s - before.demand_s) / seconds, stalled)
            by_process[t.pid] = by_process.get(t.pid, 0.0) + averages[tid][0]
        active = sum(1 for cpus, _ in averages.values() if cpus >= ACTIVE_THREAD_CPUS)
        attributed = sum(cpus for cpus, _ in averages.values())
        if m[C.CPU_DEMAND] - attributed >= ACTIVE_THREAD_CPUS:
            active += 1  # threads not kept individually
        m[C.CPU_CAPACITY] = float(min(capacity_limit, max(1, active)))
        m[C.HOT_THREADS] = float(sum(1 for cpus, stalled in averages.values()
                                     if cpus >= C.HOT_THREAD_CPUS and stalled < STALLED_THREAD_SHARE))
        m[C.BUSIEST_THREAD] = max((cpus for cpus, _ in averages.values()), default=0.0)
        _gpu_signals(window, first, last, by_process, m, sources)
    else:
        missing["schedstat"] = "no usage samples yet"
    own = first.psi_own and last.psi_own
    for resource, name, shared, full in (
            ("cpu", C.PSI_CPU, C.SHARED_PSI_CPU, False), ("memory", C.PSI_MEMORY, C.SHARED_PSI_MEMORY, False),
            ("memory", C.PSI_MEMORY_FULL, None, True), ("io", C.PSI_IO, C.SHARED_PSI_IO, False),
            ("io", C.PSI_IO_FULL, None, True)):
        value = _pressure_pct(first.psi, last.psi, resource, seconds, full)
        if value is not None and (own or shared is not None):
            m[name if own else shared] = value
    if C.PSI_CPU in m or C.PSI_MEMORY in m:
        sources.append("psi")
    elif first.psi and last.psi:
        missing["psi"] = f"{psi_scope or 'its cgroup'}: pressure there is not the workload's own"
    for resource, name in (("cpu", C.HOST_PSI_CPU), ("memory", C.HOST_PSI_MEMORY), ("io", C.HOST_PSI_IO)):
        value = _pressure_pct(first.host_psi, last.host_psi, resource, seconds)
        if value is not None:
            m[name] = value
    if last.io_readable:
        sources.append("proc_io")
        m[C.IO_BYTES] = max(0, last.io_bytes - first.io_bytes) / seconds
        m[C.MAJOR_FAULTS] = max(0, last.major_faults - first.major_faults) / seconds
    sleeps = last.sleep_samples - first.sleep_samples
    if sleeps >= MIN_STATE_SAMPLES:
        sources.append("task_state")
        m[C.D_STATE_SHARE] = (last.d_samples - first.d_samples) / sleeps
    if delayacct:
        sources.append("delayacct")
        m[C.BLKIO_DELAY] = min(100.0, (last.blkio_ticks - first.blkio_ticks) / CLOCK_TICKS / seconds * 100.0)
    if host_cpus is not None:
        m[C.HOST_CPUS] = float(host_cpus)
    if last.memory is not None and last.memory[1]:
        m[C.MEMORY_USE] = last.memory[0] / last.memory[1]
    if first.energy is not None and last.energy is not None:
        package = _energy_delta(first.energy.package_uj, last.energy.package_uj, last.energy.max_uj)
        if package > 0:
            sources.append("rapl")
            m[C.RAPL_DRAM_RATIO] = _energy_delta(first.energy.dram_uj, last.energy.dram_uj, last.energy.max_uj) / package
    return C.WorkloadSignals(label, seconds, window_goal_s, tier, {k: round(v, 6) for k, v in m.items()},
                             tuple(sources), {k: v for k, v in missing.items() if k not in sources}, hints, gpu_present,
                             psi_scope)


def _gpu_signals(window: Window, first: Snapshot, last: Snapshot, by_process: Mapping[int, float],
                 m: Dict[str, float], sources: list) -> None:
    """Its processes' GPU use, averaged over the window's readings, and the CPUs wanted by its
    processes that hold no GPU (the input workers that feed the ones that do)."""
    readings = [s.gpu for s in window.snapshots if first.at < s.at <= last.at and s.gpu is not None]
    if not readings:
        return
    sources.append("nvml")
    m[C.GPU_UTIL] = sum(g.util_pct for g in readings) / len(readings)
    m[C.GPU_MEMORY_UTIL] = sum(g.memory_util_pct for g in readings) / len(readings)
    holders = set().union(*(g.pids for g in readings))
    workers = [cpus for pid, cpus in by_process.items() if pid not in holders and cpus >= C.INPUT_WORKER_ACTIVE_CPUS]
    m[C.INPUT_WORKERS] = float(len(workers))
    m[C.INPUT_WORKER_CPUS] = sum(workers)


def _energy_delta(before: int, after: int, wrap: int) -> float:
    return float(after - before if after >= before else after + wrap - before)
