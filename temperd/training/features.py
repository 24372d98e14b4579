"""What each thread of a workload did while it was trained: pure functions from the parsed trace
(temperd.trace.parse) and the /proc samples to one ThreadFeatures per thread.

Per thread: CPU share (on-CPU time over the trace), demand (on a CPU or waiting for one), on-CPU
burst lengths (p50, p99), wakeups received per second and who woke it (an interrupt, a thread of
its own process, another process of the workload, a process outside it), whom it woke, the
share of its sleeps in D state, and its runqueue wait per switch-in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from temperd.trace.parse import BURST_BUCKETS, ThreadStats, TraceSummary, burst_bucket_bounds_us
from temperd.training.names import name_key
from temperd.training.samples import Samples, ThreadSeries

INTERRUPT = "interrupt"  # a hard interrupt: mostly timers (sleeps, timeouts)
NETWORK = "network"  # a softirq: network receive, loopback from a client included
SAME_PROCESS = "same process"
WORKLOAD = "other process of the workload"
OUTSIDE = "outside the workload"


@dataclass
class ThreadFeatures:
    tid: int
    pid: int
    comm: str
    key: str  # the normalised name (names.name_key)
    process_name: str
    title: str  # its process's title (the last one seen)
    cpu_share: float  # CPUs: on-CPU time / trace duration
    demand: float  # CPUs: (on a CPU + waiting on a runqueue) / duration
    burst_p50_us: float
    burst_p99_us: float
    wakeups_per_s: float  # every wakeup it received, interrupts included
    woken_by: Dict[str, int]  # INTERRUPT / NETWORK / SAME_PROCESS / WORKLOAD / OUTSIDE -> wakeups
    wakers: Dict[int, int]  # waker tid (in the workload) -> wakeups
    wakees: Dict[int, int]  # wakee tid (in the workload) -> wakeups it caused
    d_share: float  # of its sleeps, the share in D (uninterruptible, usually I/O)
    cpu_per_second: List[float] = field(default_factory=list)  # CPUs in each second of the trace
    burst_histogram: List[int] = field(default_factory=list)  # trace.parse.ThreadStats.bursts

    def external_wakeups_per_s(self, duration_s: float) -> float:
        """Wakeups that come from outside the workload's processes but not from a timer: network
        receive (loopback clients included) and other processes (a pipe, a futex shared with a
        client)."""
        return (self.woken_by.get(OUTSIDE, 0) + self.woken_by.get(NETWORK, 0)) / max(duration_s, 1e-9)


@dataclass
class WorkloadFeatures:
    duration_s: float
    threads: Dict[int, ThreadFeatures]
    titles: Dict[int, str]  # pid -> last title


def burst_percentile_us(histogram: List[int], fraction: float) -> float:
    """The burst length (us) below which `fraction` of the bursts fall: the geometric middle of
    the histogram bucket holding that rank; 0 without bursts."""
    total = sum(histogram)
    if not total:
        return 0.0
    rank = fraction * total
    seen = 0
    for index, count in enumerate(histogram):
        seen += count
        if seen >= rank and count:
            low, high = burst_bucket_bounds_us(index)
            return round((max(low, 0.5) * high) ** 0.5, 1)
    return burst_bucket_bounds_us(BURST_BUCKETS - 1)[1]


def _sample_deltas(series: Optional[ThreadSeries]) -> Tuple[int, int, float, float]:
    """(run ns, wait ns, seconds covered, D share of the sleeping samples) from a thread's /proc samples."""
    if series is None or not series.samples:
        return 0, 0, 0.0, 0.0
    first, last = series.samples[0], series.samples[-1]
    sleeping = [s.state for s in series.samples if s.state in ("S", "D")]
    d_share = sleeping.count("D") / len(sleeping) if sleeping else 0.0
    return last.run_ns - first.run_ns, last.wait_ns - first.wait_ns, last.t - first.t, d_share


def workload_features(summary: TraceSummary, samples: Samples) -> WorkloadFeatures:
    """ThreadFeatures of every thread of the workload that the samples or the trace saw."""
    duration_s = summary.duration_ns / 1e9 if summary.duration_ns else samples.duration_s
    duration_s = max(duration_s, 1e-3)
    pid_of: Dict[int, int] = {tid: s.pid for tid, s in samples.threads.items()}
    for tid, stats in summary.threads.items():
        if tid not in pid_of and stats.tgid in samples.processes:
            pid_of[tid] = stats.tgid
    names = {pid: info.name for pid, info in samples.processes.items()}
    titles = {pid: (info.titles[-1] if info.titles else "") for pid, info in samples.processes.items()}
    wakers: Dict[int, Dict[int, int]] = {}
    wakees: Dict[int, Dict[int, int]] = {}
    outside: Dict[int, int] = {}
    same: Dict[int, int] = {}
    other: Dict[int, int] = {}
    for (waker, wakee), count in summary.edges.items():
        if wakee not in pid_of:
            continue
        if waker in pid_of:
            wakers.setdefault(wakee, {})[waker] = count
            wakees.setdefault(waker, {})[wakee] = count
            bucket = same if pid_of[waker] == pid_of[wakee] else other
        else:
            bucket = outside
        bucket[wakee] = bucket.get(wakee, 0) + count
    seconds = int(duration_s + 0.999)
    threads: Dict[int, ThreadFeatures] = {}
    for tid, pid in pid_of.items():
        series = samples.threads.get(tid)
        stats = summary.threads.get(tid) or ThreadStats(tid, "?")  # not in the trace: nothing counted
        # /proc's name first: the trace's text cannot carry a name holding a newline, which ends
        # its line (b\\nFAKE LINE would be FAKE LINE there).
        comm = series.comm if series is not None else stats.comm
        run_ns, wait_ns, covered, d_sampled = _sample_deltas(series)
        if stats.runtime_ns:
            cpu = stats.runtime_ns / 1e9 / duration_s
        else:
            cpu = run_ns / 1e9 / covered if covered else 0.0
        wait = wait_ns / 1e9 / covered if covered else stats.wait_ns / 1e9 / duration_s
        d_share = stats.blocked_d / stats.blocked if stats.blocked else d_sampled
        per_second = [0.0] * seconds
        for second, ns in stats.cpu_by_second.items():
            if 0 <= second < seconds:
                per_second[second] = round(ns / 1e9, 4)
        threads[tid] = ThreadFeatures(
            tid=tid, pid=pid, comm=comm, key=name_key(comm), process_name=names.get(pid, comm),
            title=titles.get(pid, ""), cpu_share=round(cpu, 4), demand=round(cpu + wait, 4),
            burst_p50_us=burst_percentile_us(stats.bursts, 0.5), burst_p99_us=burst_percentile_us(stats.bursts, 0.99),
            wakeups_per_s=round((stats.wakeups + stats.irq_wakeups) / duration_s, 2),
            woken_by={INTERRUPT: stats.irq_wakeups - stats.softirq_wakeups, NETWORK: stats.softirq_wakeups,
                      SAME_PROCESS: same.get(tid, 0), WORKLOAD: other.get(tid, 0), OUTSIDE: outside.get(tid, 0)},
            wakers=wakers.get(tid, {}), wakees=wakees.get(tid, {}),
            d_share=round(d_share, 3),
            cpu_per_second=per_second, burst_histogram=list(stats.bursts))
    return WorkloadFeatures(round(duration_s, 3), threads, titles)
