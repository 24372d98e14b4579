"""What the scheduler actually does: per-layer CPU use, runqueue wait, placement of busy threads,
PSI, scheduling delay per layer (the Telemetry of sources.runqlat: bpf where it loads, else fed
by the schedstat read here), and the observation's own cost.

Budget: temperd's always-on cost should stay near 0.13 % of one core, so a sample reads the
plan's member threads (schedstat + stat) and each process's utime+stime — not every thread on
the host; per-thread detail outside the plan only for the few busiest processes. The threads of a
process that did not run are not read again until its utime+stime moves (_idle_processes), and a
many-threaded process's utime+stime only when its cgroup's CPU time moved (process_cpu).
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Mapping, NamedTuple, Optional, Sequence, Set, Tuple

from temperd.control.status import OverheadView
from temperd.observe.process_cpu import ProcessTicks
from temperd.sources import host_cpu, procfs, psi
from temperd.sources.runqlat import LatencyReport, Telemetry
from temperd.plan import LayerPlan

TOP_PROCESSES = 3  # unmanaged processes whose threads are looked at each sample
TOP_THREADS = 20
BUSY_RATIO = 0.1  # a thread using >= 10 % of a CPU counts as busy


@dataclass(frozen=True)
class ThreadSample:
    tid: int
    pid: int
    comm: str
    cpu: int  # CPU it last ran on
    util: float  # CPUs (1.0 = one CPU) since the previous sample
    wait: float  # runqueue wait, seconds per second
    policy: int
    nice: int
    affinity: Tuple[int, ...]
    layer: Optional[str] = None
    workload: Optional[str] = None
    group: Optional[str] = None
    core: Optional[str] = None
    sibling_busy: Optional[bool] = None  # None: no SMT sibling


@dataclass(frozen=True)
class LayerStats:
    name: str
    kind: str
    treatment: str
    cpus: Tuple[int, ...]
    members: int
    util: float
    wait: float
    tier: str = ""
    ownership: Optional[str] = None  # owned | fenced: an exclusive layer's CPUs; None: holds none


@dataclass
class Observation:
    at: float
    machine_shape: dict
    layers: List[LayerStats]
    threads: List[ThreadSample]  # watched members and the busiest others
    psi: Optional[dict]
    overhead: OverheadView
    unmanaged_busy: List[dict] = field(default_factory=list)
    latency: Optional[LatencyReport] = None  # scheduling delay per layer (sources.runqlat)
    # The share of the window each CPU sat idle (/proc/stat), by CPU number; empty before a window.
    # It sees what the threads read above do not: a CPU kept busy by a thread outside the plan.
    cpu_idle: Dict[int, float] = field(default_factory=dict)

    def psi_avg10(self, kind: str) -> Optional[float]:
        """CPU pressure ("some" or "full") over the last 10 s, in percent; None where the kernel has none."""
        line = (self.psi or {}).get(kind)
        return line["avg10"] if line else None

    def to_json(self) -> dict:
        top = sorted(self.threads, key=lambda t: -t.util)[:TOP_THREADS]
        return {
            "at": self.at,
            "machine_shape": self.machine_shape,
            "layers": [asdict(layer) for layer in self.layers],
            "top_threads": [asdict(t) for t in top],
            "psi": self.psi,
            "overhead": asdict(self.overhead),
            "latency": self.latency.as_json() if self.latency is not None else None,
        }


class Observer:
    def __init__(self, shape, telemetry: Optional[Telemetry] = None):
        self.shape = shape
        self.telemetry = telemetry
        self._runtime: Dict[Tuple[int, int], Tuple[int, int, int]] = {}  # (pid, tid) -> schedstat
        self._files: Dict[Tuple[int, int], _Files] = {}  # (pid, tid) -> its stat and affinity as last read
        self._quiet: Set[int] = set()  # processes none of whose threads ran before the previous sample
        self._plan: Optional[LayerPlan] = None  # the plan of the previous sample
        self._proc_ticks: Dict[int, int] = {}
        self.process_ticks = ProcessTicks()
        self._last_at: Optional[float] = None
        self._last_self_cpu = self._self_cpu()
        self._idle_shares = host_cpu.IdleShares()

    @staticmethod
    def _self_cpu() -> float:
        times = os.times()
        return times.user + times.system

    def _shape_json(self) -> dict:
        return {"summary": self.shape.describe(), "cpus": list(self.shape.cpus),
                "cores": [list(core.cpus) for core in self.shape.cores],
                "threads_per_core": self.shape.threads_per_core}

    def sample(self, plan: LayerPlan, processes: Mapping[int, object], match, now: Optional[float] = None) -> Observation:
        cpu_start = time.thread_time()
        wall = time.monotonic()
        if self.telemetry is not None:
            self.telemetry.start()  # once: bpf where it loads, else the schedstat read below feeds it
        window = (wall - self._last_at) if self._last_at is not None else 0.0
        members = {tid: layer.name for layer in plan.layers for tid in layer.selector.tids}
        tid_pid = {tid: pid for pid, proc in processes.items() for tid in proc.threads}
        watched: Set[Tuple[int, int]] = {(tid_pid[tid], tid) for tid in members if tid in tid_pid}
        unmanaged, idle = self._busiest_unmanaged(plan, processes, window, watched)
        groups = {t.tid: (w.key, t.group) for w in match.workloads for t in w.threads}
        rows = self._read_threads(processes, sorted(watched), members, groups, idle, window)
        self._plan = plan
        samples = self._samples(rows)
        by_layer = _by_layer(samples)
        layers = [self._layer_stats(layer, by_layer.get(layer.name, ())) for layer in plan.layers]
        latency = self.telemetry.end_window(plan) if self.telemetry is not None else None
        self._last_at = wall
        shares = self._idle_shares()
        overhead = self._overhead(cpu_start, window)
        return Observation(now if now is not None else time.time(), self._shape_json(), layers, samples,
                           psi.host_fields("cpu"), overhead, unmanaged, latency,
                           dict(enumerate(shares)) if shares else {})

    def _busiest_unmanaged(self, plan: LayerPlan, processes: Mapping[int, object], window: float,
                           watched: Set[Tuple[int, int]]) -> Tuple[List[dict], Set[int]]:
        """Host-wide: each process's CPU over the window; the TOP_PROCESSES busiest (their threads
        added to `watched`) and the processes idle since the previous sample (_idle_processes)."""
        busy_procs = []
        ticks_now = {}
        for pid, (ticks, used) in self.process_ticks.read(processes, {pid for pid, _tid in watched}).items():
            ticks_now[pid] = ticks
            if used is not None and pid in self._proc_ticks and window > 0:
                busy_procs.append((used, pid))
        idle = self._idle_processes(ticks_now, plan)
        self._proc_ticks = ticks_now
        busy_procs.sort(reverse=True)
        unmanaged = []
        for ratio, pid in busy_procs[:TOP_PROCESSES]:
            if ratio <= 0:
                continue
            proc = processes[pid]
            unmanaged.append({"pid": pid, "name": getattr(proc, "name", "?"), "util": round(ratio, 3)})
            watched.update((pid, tid) for tid in proc.threads)
        return unmanaged, idle

    def _read_threads(self, processes: Mapping[int, object], watched: List[Tuple[int, int]], members: Dict[int, str],
                      groups: Dict[int, Tuple[str, str]], idle: Set[int], window: float) -> List[_Row]:
        """A row per watched thread still there: its schedstat and files read again, or for a
        process idle since the previous sample, what they said then. Keeps them for the next."""
        rows: List[_Row] = []
        runtime_now: Dict[Tuple[int, int], Tuple[int, int, int]] = {}
        files_now: Dict[Tuple[int, int], _Files] = {}
        moved: Set[int] = set()  # processes with a thread that ran since the previous sample
        for pid, tid in watched:
            layer_name = members.get(tid)
            before = self._runtime.get((pid, tid))
            thread = processes[pid].threads.get(tid) if pid in idle else None
            files = self._files.get((pid, tid)) if thread is not None else None
            if files is not None:
                # Nothing of this process ran: its threads' files say what they said (a rename is
                # an event, so the name is the inventory's).
                sched3 = before
                if files.comm != thread.comm:
                    files = files._replace(comm=thread.comm)
            else:
                read = _read_thread(pid, tid)
                if read is None:
                    continue
                sched3, files = read
            runtime_now[(pid, tid)] = sched3
            files_now[(pid, tid)] = files
            util = wait = 0.0
            if sched3 != before:
                moved.add(pid)
                if before is not None and window > 0:
                    util = round(max(0, sched3[0] - before[0]) / 1e9 / window, 4)
                    wait = round(max(0, sched3[1] - before[1]) / 1e9 / window, 4)
            if layer_name is not None and self.telemetry is not None:
                self.telemetry.add_schedstat(layer_name, pid, tid, sched3[1], sched3[2])
            rows.append(_Row(tid, pid, files, util, wait, layer_name, *groups.get(tid, (None, None))))
        self._runtime = runtime_now
        self._files = files_now
        self._quiet = {pid for pid, _tid in files_now if pid not in moved}
        return rows

    @staticmethod
    def _layer_stats(layer, mine: Sequence[ThreadSample]) -> LayerStats:
        """mine: the samples of the layer's threads."""
        return LayerStats(layer.name, layer.kind, layer.treatment, tuple(layer.cpus), len(layer.selector.tids),
                          round(sum(s.util for s in mine), 4), round(sum(s.wait for s in mine), 4), layer.tier,
                          layer.holds_cpus)

    def _overhead(self, cpu_start: float, window: float) -> OverheadView:
        """What this sample cost (CPU from cpu_start on this thread) and the daemon's CPU over the window."""
        sample_cpu = time.thread_time() - cpu_start
        self_cpu = self._self_cpu()
        overhead = OverheadView(
            sample_cpu_s=round(sample_cpu, 6),
            observe_cpu_ratio=round(sample_cpu / window, 6) if window > 0 else 0.0,
            daemon_cpu_ratio=round((self_cpu - self._last_self_cpu) / window, 6) if window > 0 else 0.0,
            window_s=round(window, 3),
        )
        self._last_self_cpu = self_cpu
        return overhead

    def _idle_processes(self, ticks_now: Mapping[int, int], plan: LayerPlan) -> Set[int]:
        """Processes whose threads need not be read again: none of them ran in the window before
        the previous sample (quiet), the process's CPU ticks have not moved since, and the plan
        (which the backend carries out on their affinity, policy and nice) is the same. A 2 000-
        thread pool that sleeps then costs one read of /proc/PID/stat a sample, not 6 000 reads;
        a thread that runs less than a tick between two samples is counted at the next read."""
        if plan != self._plan:
            return set()
        return {pid for pid in self._quiet if pid in ticks_now and ticks_now[pid] == self._proc_ticks.get(pid)}

    def _samples(self, rows: List[_Row]) -> List[ThreadSample]:
        """Each thread's sample, with the core of its CPU and whether a busy thread ran last on
        its SMT sibling."""
        busy_on: Dict[int, List[_Row]] = {}
        for row in rows:
            if row.util >= BUSY_RATIO:
                busy_on.setdefault(row.files.cpu, []).append(row)
        out = []
        for row in rows:
            files = row.files
            core_key = sibling_busy = None
            try:
                core_key = self.shape.core_of(files.cpu).core_key
            except KeyError:
                pass
            else:
                siblings = self.shape.siblings(files.cpu)
                if siblings:
                    sibling_busy = any(o.tid != row.tid for c in siblings for o in busy_on.get(c, ()))
            out.append(ThreadSample(row.tid, row.pid, files.comm, files.cpu, row.util, row.wait, files.policy,
                                    files.nice, files.affinity, row.layer, row.workload, row.group, core_key,
                                    sibling_busy))
        return out


class _Files(NamedTuple):
    """What a thread's stat and affinity said when last read."""

    comm: str
    cpu: int
    policy: int
    nice: int
    affinity: Tuple[int, ...]


class _Row(NamedTuple):
    """One watched thread in a sample, before its placement is known."""

    tid: int
    pid: int
    files: _Files
    util: float
    wait: float
    layer: Optional[str]
    workload: Optional[str]
    group: Optional[str]


def _read_thread(pid: int, tid: int) -> Optional[Tuple[Tuple[int, int, int], _Files]]:
    """A thread's schedstat, stat and affinity; None where it is gone."""
    sched3 = procfs.read_schedstat(pid, tid)
    stat = procfs.read_task_stat(pid, tid)
    if sched3 is None or stat is None:
        return None
    affinity = procfs.read_affinity(tid, pid) or frozenset()
    return sched3, _Files(stat.comm, stat.last_cpu, stat.policy, stat.nice, tuple(sorted(affinity)))


def _by_layer(samples: List[ThreadSample]) -> Dict[Optional[str], List[ThreadSample]]:
    """The samples by their layer's name, in their order: one pass, not one per layer."""
    out: Dict[Optional[str], List[ThreadSample]] = {}
    for sample in samples:
        out.setdefault(sample.layer, []).append(sample)
    return out
