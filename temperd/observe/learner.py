"""The learner and its thread ("learner"): what temperd learns of each tracked workload (matched or bound) for
classification and rightsizing. Every [rightsizing] sample_interval_s (1 s) it has the tracker
(observe/usage_tracker.py) sample each workload, every SNAPSHOT_S snapshot the classification
counters, and it answers classify and rightsize from the windows and the usage history. While
every tracked workload rests it looks every idle_sample_interval_s (5 s) instead: a sleeping
workload of thousands of threads costs one small read every 5 s.

Workloads are named by observe/workload_labels.py (unit, binding, own cgroup, else profile and
instance: no pid, so labels stay bounded and histories outlive processes). Whether a workload's
cgroup is its own (no other process in it) is read from its cgroup.procs every SNAPSHOT_S: only
then is that cgroup's pressure the workload's own signal.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from temperd.config.daemon_config import LearnerSettings
from temperd.control.status import LearnerView
from temperd.decide.classify import Classification, Hints, classify
from temperd.decide.rightsize import Declared, Recommendation, rightsize
from temperd.decide.sizing import GroupDemand, group_demands
from temperd.files import OUT_OF_DESCRIPTORS
from temperd.observe import workload_window as W
from temperd.observe.metrics import LearnerMetrics
from temperd.observe.usage_history import UsageHistory
from temperd.observe.usage_tracker import Tracked, UsageTracker
from temperd.observe.workload_labels import workload_labels
from temperd.plan import EXCLUSIVE
from temperd.sources import cgroups, host_cpu, nvml, perf, psi, rapl
from temperd.sources.delayacct import delayacct_state
from temperd.sources.procfs import CLOCK_TICKS
from temperd.sources.shape import parse_cpulist

log = logging.getLogger("temperd.learner")

SNAPSHOT_S = 5.0
SAVE_EVERY_S = 300.0
# With no workload to sample, look again this often rather than every sample interval: an idle
# host's temperd then wakes for nothing; a workload that appears waits at most this for its first sample.
NOTHING_TRACKED_WAIT_S = 5.0
SHORT_WARN_EVERY_S = 60.0
# A workload is tracked once its oldest process has run this long: what a process of a few
# seconds used says nothing to classification or rightsizing, and a fork storm's hundreds of
# short-lived workloads would each cost reads every sample (bench/churn.py).
TRACK_AFTER_S = 5.0


def settled(workloads: Sequence, processes: Mapping[int, object], now_ticks: int) -> Tuple:
    """The workloads whose oldest process started TRACK_AFTER_S or more before now_ticks
    (processes: the inventory's facts by pid; start times in clock ticks after boot)."""
    latest = now_ticks - TRACK_AFTER_S * CLOCK_TICKS
    return tuple(w for w in workloads
                 if any(pid in processes and processes[pid].start_time <= latest for pid in w.pids))


class WorkloadLearner:
    def __init__(self, settings: LearnerSettings, host_cpus: int,
                 current: Callable[[], Tuple[Sequence, object, Mapping[str, object]]],
                 metrics: Optional[LearnerMetrics] = None):
        """current(): the tracked workloads, the plan in force and the profiles by id, read under the
        daemon's lock by the caller's function. metrics: updated after each snapshot."""
        self.settings = settings
        self.metrics = metrics
        self.host_cpus = host_cpus
        self.current = current
        self.history = UsageHistory(settings.history_file, settings.half_life_h * 3600.0, settings.keep_threads)
        self.lock = threading.Lock()  # the history and tracked state, between this thread and readers
        self.tracked: Dict[str, Tracked] = {}

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
        self._idle_shares = host_cpu.IdleShares()  # each CPU's idle share since the last sample
        self.last_sample_cpu_s = 0.0
        self.cpu_s_total = 0.0  # this thread's CPU for samples since start (its whole cost)
        self.samples = 0
        self.history_bytes = 0
        self.static_missing = self._static_missing()
        self.tracker = UsageTracker(settings, self.history, energy="rapl" not in self.static_missing)
        self.delayacct = "delayacct" not in self.static_missing
        self.gpu_present = "nvml" not in self.static_missing
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

    def start(self) -> None:
        if self.gpu_present:
            self._gpu, why = nvml.open_reader()
            if self._gpu is None:
                self.static_missing["nvml"] = why
                log.warning("GPU use not measured: %s", why)
        self._thread = threading.Thread(target=self._run, name="learner", daemon=True)
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

    def _run(self) -> None:
        while not self._stop.wait(self._next_wait_s()):
            try:
                self.sample_once(time.time())
                if time.monotonic() - self._saved_at >= SAVE_EVERY_S:
                    self._saved_at = time.monotonic()
                    self.save()
            except OSError as exc:
                if exc.errno not in OUT_OF_DESCRIPTORS:
                    log.exception("usage sample failed")
                elif time.monotonic() - self._short_warned_at >= SHORT_WARN_EVERY_S:
                    # the main loop reports running short once; this only says samples are missed
                    self._short_warned_at = time.monotonic()
                    log.warning("usage samples skipped while descriptors run short: %s "
                                "(logged at most once a minute)", exc.strerror)
            except Exception:  # a bad sample must not end the thread; the next one tries again
                log.exception("usage sample failed")

    # ---- one sample -----------------------------------------------------------------------------

    def sample_once(self, now: float) -> None:
        started = time.thread_time()
        idle_by_cpu = self._idle_shares()
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
                    tracked = self.tracked[label] = Tracked(label, w.key)
                self.tracker.sample(tracked, w, now, idle_by_cpu)
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
                    self.tracker.snapshot(self.tracked[self._labels[w.key]], w, now, host_pressure, gpu,
                                          self._own_cgroup(w, now))
        metrics_due = snapshot_due and now >= self._next_metrics
        if metrics_due and self.metrics is not None:
            self._next_metrics = now + self.settings.metrics_interval_s
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

    # ---- what readers ask -------------------------------------------------------------------------

    def describe(self) -> LearnerView:
        """Its own cost and state, for temperctl status."""
        return LearnerView(len(self.tracked), self.samples, round(self.cpu_s_total, 6), round(self.last_sample_cpu_s, 6),
                           self.history.path, self.history_bytes, self.history.loaded_from)

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
        capacity = self._capacity(w)
        if w.budget is not None:
            return Declared(w.budget, w.budget_reason, capacity, throttled, granted)
        if capacity < self.host_cpus:
            return Declared(float(capacity), f"cpuset {cgroups.cpuset_cpus(w.cgroup)} of cgroup {w.cgroup} "
                            "(AllowedCPUs=)", capacity, throttled, granted)
        return Declared(None, "no quota, cpuset or binding cpus", self.host_cpus, throttled, granted)

    def _hints(self, w) -> Hints:
        profile = self._profiles.get(w.profile_id or "")
        return Hints(f"profile {profile.id} [traits]", profile.traits) if profile is not None else Hints()

    def _select(self, pid: Optional[int], unit: Optional[str]) -> List[Tuple[str, object]]:
        return [(self._labels[key], w) for key, w in sorted(self._workloads.items())
                if (pid is None or pid in w.pids) and (unit is None or unit in (w.unit, self._labels.get(key)))]

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
