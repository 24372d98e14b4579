"""What temperd learns of each tracked workload (matched or bound): its usage history for
rightsizing and the signals it is classified by. It runs on a thread of its own ("usage"): every
[rightsizing] sample_interval_s (1 s) it samples each workload, and every SNAPSHOT_S it snapshots
the classification counters.

A sample of a workload in a cgroup of its own starts with its cgroup's CPU time: unchanged, and
nothing else is read. Otherwise it costs one read of /proc/PID/stat per process; only where the
process used CPU since the previous sample are its kept threads (the keep_threads busiest of the
workload) read, one schedstat and one stat each. A workload whose cgroup has used no CPU for
RESTING_AFTER_S is resting: while every tracked workload rests, the thread looks every
idle_sample_interval_s (5 s) instead, and a look counts for the sampling intervals it covers. So a
sleeping workload of thousands of threads costs one small read every 5 s, and a thread busy 2 s in
every 10 s is still sampled every second.
Which threads are kept is decided anew every RERANK_S from every thread's runtime, read only for
processes that ran meanwhile. A thread's usage is what it wants (wanted_cpus): its on-CPU time as
a share of the time it was not kept waiting on a runqueue or by its quota, at most one CPU, while
the host had idle CPUs; on a saturated host, what it got where it slept, and where it hardly slept
and waited it was starved (demand()): that interval counts what it got and is marked, so
rightsizing never reads a thread behind on fixed work as a spinner.

Workloads are named by observe/workload_labels.py (unit, binding, own cgroup, else profile and
instance: no pid, so labels stay bounded and histories outlive processes). Whether a workload's
cgroup is its own (no other process in it) is read from its cgroup.procs every SNAPSHOT_S: only
then is that cgroup's pressure the workload's own signal.
"""

from __future__ import annotations

import errno
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from temperd.config.daemon_config import KnowledgeSettings
from temperd.decide.classify import Classification, Hints, classify
from temperd.decide.rightsize import Declared, Recommendation, rightsize
from temperd.decide.sizing import GroupDemand, group_demands
from temperd.observe import workload_window as W
from temperd.observe.metrics import KnowledgeMetrics
from temperd.observe.usage_history import ThreadSample, UsageHistory
from temperd.observe.workload_labels import workload_labels
from temperd.plan import EXCLUSIVE
from temperd.sources import cgroups, host_cpu, perf, psi, rapl
from temperd.sources.delayacct import delayacct_state
from temperd.sources import nvml
from temperd.sources.proc_io import read_process_io
from temperd.sources.runqlat import read_schedstat3
from temperd.sources.shape import parse_cpulist
from temperd.sources.task_counters import CLOCK_TICKS, read_process_counters, read_task_counters

log = logging.getLogger("temperd.knowledge")

SNAPSHOT_S = 5.0
METRICS_EVERY_S = 30.0  # /metrics' classes and recommendations (temperctl and /observe compute theirs when asked)
RERANK_S = 60.0
SAVE_EVERY_S = 300.0
# With no workload to sample, look again this often rather than every sample interval: an idle
# host's temperd then wakes for nothing; a workload that appears waits at most this for its first sample.
NOTHING_TRACKED_WAIT_S = 5.0
# A workload whose own cgroup used no CPU for this long rests (module docstring): longer than the idle
# gaps of the duty cycles per-second samples exist to see.
RESTING_AFTER_S = 30.0
SHORT_WARN_EVERY_S = 60.0
_NO_DESCRIPTORS = (errno.EMFILE, errno.ENFILE)
SLEEPING = ("S", "D")
# On a host whose CPUs were idle less than HOST_ROOM_CPUS together over an interval, a thread that
# slept less than STARVED_SLEEP_SHARE of it and waited at least STARVED_WAIT_SHARE on a runqueue was starved.
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
class _Tracked:
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


def demand(ran_s: float, waited_s: float, interval_s: float, host_idle_cpus: Optional[float]) -> Tuple[float, bool]:
    """(the CPUs a thread wanted over an interval, whether it was starved).

    With idle CPUs on the host (at least HOST_ROOM_CPUS on average), its waits were not for want
    of CPU: wanted_cpus. On a saturated host, a thread that slept got what it wanted (its run
    share); one that hardly slept and waited at least STARVED_WAIT_SHARE of the interval was
    starved: a spinner and a thread behind on fixed work look alike then, so its demand is unknown,
    at least its run share (returned, marked starved)."""
    if interval_s <= 0:
        return 0.0, False
    if host_idle_cpus is None or host_idle_cpus >= HOST_ROOM_CPUS:
        return wanted_cpus(ran_s, waited_s, interval_s), False
    got = min(1.0, ran_s / interval_s)
    slept = interval_s - ran_s - waited_s
    return got, slept < STARVED_SLEEP_SHARE * interval_s and waited_s >= STARVED_WAIT_SHARE * interval_s


class WorkloadWatch:
    def __init__(self, settings: KnowledgeSettings, host_cpus: int,
                 current: Callable[[], Tuple[Sequence, object, Mapping[str, object]]],
                 metrics: Optional[KnowledgeMetrics] = None):
        """current(): the tracked workloads, the plan in force and the profiles by id, read under the
        daemon's lock by the caller's function. metrics: updated after each snapshot."""
        self.settings = settings
        self.metrics = metrics
        self.host_cpus = host_cpus
        self.current = current
        self.history = UsageHistory(settings.history_file, settings.half_life_h * 3600.0, settings.keep_threads)
        self.lock = threading.Lock()  # the history and tracked state, between this thread and readers
        self.tracked: Dict[str, _Tracked] = {}
        self._labels: Dict[str, str] = {}
        self._cgroup_members: Dict[str, Tuple[float, Optional[frozenset]]] = {}  # cgroup -> (read at, its procs)
        self._workloads: Dict[str, object] = {}
        self._plan = None
        self._profiles: Mapping[str, object] = {}
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._next_snapshot = 0.0
        self._next_metrics = 0.0
        self._saved_at = time.monotonic()
        self._short_warned_at = -SHORT_WARN_EVERY_S
        self._idle_mark: Optional[Tuple[float, float]] = None  # (host idle seconds, monotonic time) at the last sample
        self.last_sample_cpu_s = 0.0
        self.cpu_s_total = 0.0  # this thread's CPU for samples since start (its whole cost)
        self.samples = 0
        self.history_bytes = 0
        self.static_missing = self._static_missing()
        self.delayacct = delayacct_state()[0]
        self.gpu_present = nvml.gpu_state()[0]
        self._gpu: Optional[nvml.NvmlReader] = None  # opened at start() where a GPU is present

    @staticmethod
    def _static_missing() -> Dict[str, str]:
        """Sources the host lacks, and why (checked once: hardware does not come and go)."""
        missing = {}
        on, why = delayacct_state()
        if not on:
            missing["delayacct"] = why
        missing["perf"] = perf.pmu_state()[1]
        energy, why = rapl.read_energy()
        if energy is None:
            missing["rapl"] = why
        present, why = nvml.gpu_state()
        if not present:
            missing["nvml"] = why
        return missing

    # ---- the thread -----------------------------------------------------------------------------

    def load(self) -> None:
        """Read the history file (once, before temperd changes anything on the host)."""
        self.history.load()

    def start(self) -> None:
        if self.gpu_present:
            self._gpu, why = nvml.open_reader()
            if self._gpu is None:
                self.static_missing["nvml"] = why
                log.warning("GPU use not measured: %s", why)
        self._thread = threading.Thread(target=self._run, name="usage", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._gpu is not None:
            self._gpu.close()
        self.save()

    def save(self) -> None:
        if not self.settings.rightsizing:
            return
        with self.lock:
            try:
                self.history_bytes = self.history.save()
            except OSError as exc:
                log.warning("cannot save the rightsizing history to %s: %s", self.history.path, exc.strerror or exc)

    def _next_wait_s(self) -> float:
        with self.lock:
            tracked = bool(self._workloads)
            resting = tracked and bool(self.tracked) and all(t.resting for t in self.tracked.values())
        interval = self.settings.sample_interval_s
        if resting:
            return max(interval, self.settings.idle_sample_interval_s)
        return interval if tracked or not self.samples else max(interval, NOTHING_TRACKED_WAIT_S)

    def _intervals(self, t: _Tracked, now: float) -> int:
        """How many sampling intervals this look at t covers (more than one after a resting wait)."""
        if t.sampled_at is None:
            return 1
        return max(1, int(round((now - t.sampled_at) / self.settings.sample_interval_s)))

    def _run(self) -> None:
        while not self._stop.wait(self._next_wait_s()):
            try:
                self.sample_once(time.time())
                if time.monotonic() - self._saved_at >= SAVE_EVERY_S:
                    self._saved_at = time.monotonic()
                    self.save()
            except OSError as exc:
                if exc.errno not in _NO_DESCRIPTORS:
                    log.exception("usage sample failed")
                elif time.monotonic() - self._short_warned_at >= SHORT_WARN_EVERY_S:
                    # the main loop reports running short once; this only says samples are missed
                    self._short_warned_at = time.monotonic()
                    log.warning("usage samples skipped while descriptors run short: %s "
                                "(logged at most once a minute)", exc.strerror)
            except Exception:  # a bad sample must not end the thread; the next one tries again
                log.exception("usage sample failed")

    # ---- one sample -----------------------------------------------------------------------------

    def _host_idle_cpus(self) -> Optional[float]:
        """The host's idle CPUs on average since the previous sample (None at the first)."""
        idle, at = host_cpu.idle_seconds(), time.monotonic()
        before, self._idle_mark = self._idle_mark, (idle, at)
        if before is None or at <= before[1]:
            return None
        return max(0.0, (idle - before[0]) / (at - before[1]))

    def sample_once(self, now: float) -> None:
        started = time.thread_time()
        host_idle = self._host_idle_cpus()
        workloads, plan, profiles = self.current()
        with self.lock:
            self._labels = workload_labels(workloads, lambda w: self._own_cgroup(w, now))
            self._workloads = {w.key: w for w in workloads}
            self._plan, self._profiles = plan, profiles
            live = set()
            for w in workloads:
                label = self._labels[w.key]
                live.add(label)
                tracked = self.tracked.get(label)
                if tracked is None or tracked.key != w.key:
                    tracked = self.tracked[label] = _Tracked(label, w.key)
                self._sample_workload(tracked, w, now, host_idle)
            for label in list(self.tracked):
                if label not in live:
                    del self.tracked[label]
            cgroups_now = {w.cgroup for w in workloads}
            self._cgroup_members = {c: v for c, v in self._cgroup_members.items() if c in cgroups_now}
            snapshot_due = now >= self._next_snapshot
            if snapshot_due:
                self._next_snapshot = now + SNAPSHOT_S
                host_pressure = psi.host_pressure()
                gpu = self._read_gpu()
                for w in workloads:
                    self._snapshot(self.tracked[self._labels[w.key]], w, now, host_pressure, gpu)
        metrics_due = snapshot_due and now >= self._next_metrics
        if metrics_due and self.metrics is not None:
            self._next_metrics = now + METRICS_EVERY_S
            self.metrics.update(self.classifications() if self.settings.classify else [],
                                self.recommendations() if self.settings.rightsizing else [], self.history_bytes)
        self.last_sample_cpu_s = time.thread_time() - started
        self.cpu_s_total += self.last_sample_cpu_s
        self.samples += 1

    def _read_gpu(self) -> Optional[nvml.GpuReading]:
        if self._gpu is None:
            return None
        try:
            return self._gpu.read()
        except nvml.NvmlError as exc:  # a GPU fallen off the bus: say so once, stop asking
            log.warning("GPU use no longer measured: %s", exc)
            self.static_missing["nvml"] = f"NVML failed: {exc}"
            self._gpu = None
            return None

    def _own_cgroup(self, w, now: float) -> bool:
        """Whether no process outside w is in w's cgroup (read again every SNAPSHOT_S); the root
        cgroup is everyone's."""
        if not w.cgroup or w.cgroup == "/":
            return False
        read_at, members = self._cgroup_members.get(w.cgroup, (None, None))
        if read_at is None or now - read_at >= SNAPSHOT_S or now < read_at:
            members = cgroups.procs(w.cgroup)
            self._cgroup_members[w.cgroup] = (now, members)
        return members is not None and bool(members) and members <= set(w.pids)

    def _sample_workload(self, t: _Tracked, w, now: float, host_idle: Optional[float] = None) -> None:
        # Its own cgroup's CPU time unchanged and the same processes: nothing ran, nothing to read
        # (/proc/PID/stat of a process with thousands of threads costs the kernel a walk over them).
        usage = cgroups.cpu_usage_us(w.cgroup) if w.cgroup and w.cgroup != "/" else None
        unchanged = usage is not None and usage == t.cgroup_usage_us and set(w.pids) == set(t.processes)
        t.cgroup_usage_us = usage
        intervals = self._intervals(t, now)
        if not unchanged:
            t.unchanged_since = None
        elif t.unchanged_since is None:  # unchanged since the sample that read the same usage
            t.unchanged_since = t.sampled_at if t.sampled_at is not None else now
        t.sampled_at = now
        if unchanged:  # kept threads or none (a pool that never ran since it was tracked): nothing to read
            if self.settings.rightsizing:
                self.history.of(t.label).record_idle(now, intervals)
            return
        moved: List[int] = []
        residual = 0.0
        elapsed = None
        for pid in w.pids:
            counters = read_process_counters(pid)
            if counters is None:
                t.processes.pop(pid, None)
                continue
            before = t.processes.get(pid)
            if before is None:
                t.processes[pid] = _Process(counters.cpu_ticks, now, major_faults=counters.major_faults)
                moved.append(pid)
                continue
            dt = now - before.at
            grown = counters.cpu_ticks - before.cpu_ticks
            before.cpu_ticks, before.at = counters.cpu_ticks, now
            t.counters.major_faults += max(0, counters.major_faults - before.major_faults)
            before.major_faults = counters.major_faults
            if grown > 0 and dt > 0:
                before.moved_since_rerank = True
                moved.append(pid)
                residual += grown / CLOCK_TICKS / dt
                elapsed = dt
        if not moved:  # nothing ran: a zero for every kept thread, counted in one go; no rank can change
            if self.settings.rightsizing:
                self.history.of(t.label).record_idle(now, intervals)
            t.counters.sampled = True
            return
        if now - t.reranked_at >= RERANK_S or len(t.kept) < min(self.settings.keep_threads, len(w.threads)):
            self._rerank(t, w, now)
        dt = elapsed or self.settings.sample_interval_s
        samples = []
        on_cpu = 0.0
        moved_set = set(moved)
        for tid, thread in t.kept.items():
            cpus = run_cpus = 0.0
            hungry = False
            if thread.pid in moved_set:
                sched = read_schedstat3(thread.pid, tid)
                task = read_task_counters(thread.pid, tid)
                if sched is None or task is None or task.start_time != thread.start_time:
                    continue
                read_at = time.monotonic()  # this thread's own interval: the sampler itself may be delayed
                interval = read_at - thread.read_at
                if thread.seen and interval > 0:
                    ran = max(0, sched[0] - thread.run_ns) / 1e9
                    waited = max(0, sched[1] - thread.wait_ns) / 1e9
                    run_cpus = min(1.0, ran / interval)
                    cpus, hungry = demand(ran, waited, interval, host_idle)
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
                totals.demand_s += cpus * dt
            on_cpu += run_cpus
            samples.append(ThreadSample(tid, thread.start_time, thread.comm, thread.group, cpus, hungry))
        residual = max(0.0, residual - on_cpu)  # what the threads not kept used
        t.counters.demand_s += (sum(s.cpus for s in samples) + residual) * dt
        t.counters.used_s += (on_cpu + residual) * dt
        t.counters.sampled = True
        if self.settings.rightsizing:
            self.history.of(t.label).record(now, samples, residual, self.settings.keep_threads, intervals)

    def _rerank(self, t: _Tracked, w, now: float) -> None:
        """Keep the busiest threads: runtime since the last rerank, read for processes that ran."""
        groups = {m.tid: (m.pid, m.comm, m.group) for m in w.threads}
        runtime: Dict[int, int] = {}
        for pid, proc in t.processes.items():
            if not proc.moved_since_rerank:
                continue
            proc.moved_since_rerank = False
            for tid, (owner, _comm, _group) in groups.items():
                if owner == pid:
                    sched = read_schedstat3(pid, tid)
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
            task = read_task_counters(pid, tid)
            if task is not None:
                kept[tid] = _Thread(pid, task.start_time, comm, group)
        t.kept = kept
        t.reranked_at = now
        t.counters.threads = {tid: v for tid, v in t.counters.threads.items() if tid in groups}

    def _snapshot(self, t: _Tracked, w, now: float, host_pressure, gpu: Optional[nvml.GpuReading]) -> None:
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
        own = self._own_cgroup(w, now)
        # The root cgroup's pressure files are the host's: read once, as host pressure.
        pressure = psi.cgroup_pressure(w.cgroup) if w.cgroup and w.cgroup != "/" else {}
        t.psi_missing = ("" if pressure else "in the root cgroup: no pressure of its own" if w.cgroup == "/"
                         else f"no pressure files for cgroup {w.cgroup or '-'}")
        t.psi_scope = f"cgroup {w.cgroup or '-'} ({'its own' if own else 'shared with other processes'})"
        energy = rapl.read_energy()[0] if "rapl" not in self.static_missing else None
        memory = cgroups.memory_use(w.cgroup) if w.cgroup else None
        used = nvml.workload_gpu(gpu, w.pids) if gpu is not None else None
        t.window.add(W.snapshot(now, t.counters, pressure, host_pressure, memory, energy, own, used),
                     self.settings.window_s)

    # ---- what readers ask -------------------------------------------------------------------------

    def describe(self) -> dict:
        """Its own cost and state, for temperctl status."""
        return {"workloads": len(self.tracked), "samples": self.samples,
                "sample_cpu_s_total": round(self.cpu_s_total, 6), "last_sample_cpu_s": round(self.last_sample_cpu_s, 6),
                "history_file": self.history.path, "history_bytes": self.history_bytes,
                "history": self.history.loaded_from}

    def _capacity(self, w) -> int:
        """The CPUs its threads may run on: the host's, or fewer where its cgroup's cpuset says so."""
        cpuset = cgroups.cpuset_cpus(w.cgroup) if w.cgroup else None
        count = len(parse_cpulist(cpuset)) if cpuset else 0
        return count if 0 < count < self.host_cpus else self.host_cpus

    def _declared(self, w) -> Declared:
        throttled = cgroups.throttling(w.cgroup) if w.cgroup else None
        granted = 0
        if self._plan is not None:
            granted = sum(len(l.cpus) for l in self._plan.layers if l.workload == w.key and l.treatment == EXCLUSIVE)
        if w.budget is not None:
            return Declared(w.budget, w.budget_reason, self._capacity(w), throttled, granted)
        cpuset = cgroups.cpuset_cpus(w.cgroup) if w.cgroup else None
        if cpuset:
            count = len(parse_cpulist(cpuset))
            if 0 < count < self.host_cpus:
                return Declared(float(count), f"cpuset {cpuset} of cgroup {w.cgroup} (AllowedCPUs=)", count,
                                throttled, granted)
        return Declared(None, "no quota, cpuset or binding cpus", self.host_cpus, throttled, granted)

    def _hints(self, w) -> Hints:
        profile = self._profiles.get(w.profile_id or "")
        return Hints(f"profile {profile.id} [traits]", profile.traits) if profile is not None else Hints()

    def _select(self, pid: Optional[int], unit: Optional[str]) -> List[Tuple[str, object]]:
        out = []
        for key, w in sorted(self._workloads.items()):
            if pid is not None and pid not in w.pids:
                continue
            if unit is not None and w.unit != unit and self._labels.get(key) != unit:
                continue
            out.append((self._labels[key], w))
        return out

    def _classify(self, label: str, w) -> Optional[Classification]:
        t = self.tracked.get(label)
        if t is None:
            return None
        declared = self._declared(w).cpus
        missing = dict(self.static_missing)
        if t.psi_missing:
            missing["psi"] = t.psi_missing
        return classify(W.signals(label, t.window, window_goal_s=self.settings.window_s, tier=w.tier,
                                  capacity_limit=min(declared or self.host_cpus, self.host_cpus),
                                  hints=self._hints(w), missing=missing, delayacct=self.delayacct,
                                  gpu_present=self.gpu_present, psi_scope=t.psi_scope, host_cpus=self._capacity(w)),
                        profile=w.profile_id)

    def classifications(self, pid: Optional[int] = None, unit: Optional[str] = None) -> List[Classification]:
        with self.lock:
            return [c for c in (self._classify(label, w) for label, w in self._select(pid, unit)) if c is not None]

    def group_demands(self, workloads: Sequence) -> Dict[Tuple[str, str], GroupDemand]:
        """(workload key, thread group) -> what the group's threads used, from the history, for
        these workloads (a match just made: at start, before this thread's first sample, the
        history loaded from the file is what sizes them)."""
        with self.lock:
            labels = workload_labels(workloads, lambda w: self._own_cgroup(w, time.monotonic()))
            out: Dict[Tuple[str, str], GroupDemand] = {}
            for w in workloads:
                history = self.history.workloads.get(labels[w.key])
                if history is not None:
                    out.update(((w.key, group), demand) for group, demand in group_demands(history.summary()).items())
            return out

    def recommendations(self, pid: Optional[int] = None, unit: Optional[str] = None) -> List[Recommendation]:
        with self.lock:
            out = []
            for label, w in self._select(pid, unit):
                if label not in self.history.workloads:
                    continue
                classified = self._classify(label, w) if self.gpu_present else None
                out.append(rightsize(self.history.workloads[label].summary(), self._declared(w), self.settings.margin,
                                     profile=w.profile_id,
                                     input_bound=classified.input_bound if classified is not None else None))
            return out
