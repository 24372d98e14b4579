"""The trial harness: one workload measured under several arms (ways of scheduling the host), beside CPU
spinners, on a host that others share.

What makes such a measurement trustworthy lives here, for the benchmarks and for evaluating a
trained profile alike:
- arms interleaved per repetition, the order reversed every other repetition, so the host's
  drift hits every arm;
- bounded CPU spinners in a cgroup of their own (what a binding names to put them in a tier),
  optionally started under a wrapper (`nice -n 19 chrt --idle 0`);
- a host-noise window over every run (idle and steal from /proc/stat, the CPU of processes that
  are not part of the trial) and noisy runs repeated;
- the runqueue wait of the processes that matter (load generator, server) over a run;
- medians with their spread, a comparison that says when a difference is within the noise, and
  whether the runs settle a goal's limit (verdicts.py).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, ContextManager, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Set, Tuple

from temperd.sources import cgroups, host_cpu, procfs
from temperd.training.verdicts import (  # noqa: F401  (part of this module's public face)
    BETTER, WITHIN_NOISE, WORSE, Bound, Comparison, Spread, bound, compare, median, settled, spread)

TICK_HZ = procfs.CLOCK_TICKS
CGROUP2_ROOT = cgroups.v2_root()


# ---- host noise -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProcCpu:
    """One process's identity and CPU use from /proc/PID/stat."""

    pid: int
    comm: str
    ppid: int
    kernel_thread: bool
    cpu_ticks: int  # utime + stime of all its threads, exited ones included


def read_proc_cpu(pid: int) -> Optional[ProcCpu]:
    stat = procfs.read_process_stat(pid)
    if stat is None:
        return None
    return ProcCpu(pid, stat.comm, stat.ppid, bool(stat.flags & procfs.PF_KTHREAD), stat.cpu_ticks)


def all_proc_cpu() -> Dict[int, ProcCpu]:
    return {pid: found for pid in procfs.list_pids() if (found := read_proc_cpu(pid)) is not None}


def descendants(root: int, procs: Mapping[int, ProcCpu]) -> Set[int]:
    """root and every process below it (by ppid)."""
    children: Dict[int, List[int]] = {}
    for proc in procs.values():
        children.setdefault(proc.ppid, []).append(proc.pid)
    out: Set[int] = set()
    todo = [root]
    while todo:
        pid = todo.pop()
        if pid not in out:
            out.add(pid)
            todo.extend(children.get(pid, ()))
    return out


def foreign_ticks(before: Mapping[int, ProcCpu], after: Mapping[int, ProcCpu], ours: Iterable[int]) -> Dict[int, int]:
    """pid -> CPU ticks used between two snapshots by each user-space process that is not below
    one of `ours` (in either snapshot); a pid whose comm changed counts as a new process."""
    mine: Set[int] = set()
    for root in ours:
        mine |= descendants(root, after) | descendants(root, before)
    out: Dict[int, int] = {}
    for pid, proc in after.items():
        if pid in mine or proc.kernel_thread or pid == procfs.KTHREADD_PID or proc.ppid == procfs.KTHREADD_PID:
            continue
        start = before.get(pid)
        used = proc.cpu_ticks - (start.cpu_ticks if start is not None and start.comm == proc.comm else 0)
        if used > 0:
            out[pid] = used
    return out


@dataclass(frozen=True)
class NoiseLimits:
    """Beyond these a run is noisy: other processes used more than foreign_core_pct of one core,
    or the hypervisor took more than steal_pct of the CPUs."""

    foreign_core_pct: float = 10.0
    steal_pct: float = 5.0


@dataclass(frozen=True)
class HostWindow:
    """What the host did during one measurement window."""

    seconds: float
    idle_pct: float  # of all CPUs (idle + iowait)
    steal_pct: float  # of all CPUs: time the hypervisor ran something else
    foreign_core_pct: float  # user-space processes outside the trial, % of one core
    foreign_top: str  # the busiest foreign process, "comm pct"
    # Rescheduling IPIs per second over all CPUs (None: not counted): how often one CPU made
    # another reschedule; on a guest each can cost a hypervisor exit.
    resched_per_s: Optional[float] = None

    def noisy(self, limits: NoiseLimits) -> bool:
        return self.foreign_core_pct > limits.foreign_core_pct or self.steal_pct > limits.steal_pct

    def describe(self) -> str:
        top = f" ({self.foreign_top})" if self.foreign_top else ""
        ipis = f", resched IPIs {self.resched_per_s:.0f}/s" if self.resched_per_s is not None else ""
        return (f"idle {self.idle_pct:.0f} %, steal {self.steal_pct:.1f} %, "
                f"foreign {self.foreign_core_pct:.1f} % of a core{top}{ipis}")


class HostMonitor:
    """Idle and steal from /proc/stat deltas; foreign CPU = utime+stime deltas of user-space
    processes that are not descendants of this process nor listed in `also_ours` (a server
    started in its own session). Processes that start and exit inside the window are not seen;
    kernel threads are left out (they mostly work for the trial: softirq for loopback traffic).
    Rescheduling IPIs from /proc/interrupts deltas."""

    def __init__(self, also_ours: Iterable[int] = ()):
        self.ours = (os.getpid(), *also_ours)
        self._t0 = 0.0
        self._cpu0: Tuple[int, ...] = ()
        self._procs0: Dict[int, ProcCpu] = {}
        self._resched0: Optional[int] = None

    def start(self) -> None:
        self._procs0 = all_proc_cpu()
        self._cpu0 = host_cpu.read_stat().total
        self._resched0 = procfs.read_resched_interrupts()
        self._t0 = time.monotonic()

    def stop(self) -> HostWindow:
        cpu1 = host_cpu.read_stat().total
        resched1 = procfs.read_resched_interrupts()
        seconds = time.monotonic() - self._t0
        procs1 = all_proc_cpu()
        delta = [b - a for a, b in zip(self._cpu0, cpu1)]
        total = sum(delta) or 1
        foreign = foreign_ticks(self._procs0, procs1, self.ours)
        top = ""
        if foreign:
            pid = max(foreign, key=foreign.__getitem__)
            top = f"{procs1[pid].comm} {100.0 * foreign[pid] / TICK_HZ / seconds:.0f}%"
        return HostWindow(seconds, 100.0 * (delta[3] + delta[4]) / total, 100.0 * delta[7] / total,
                          100.0 * sum(foreign.values()) / TICK_HZ / max(seconds, 1e-6), top,
                          None if None in (self._resched0, resched1) else (resched1 - self._resched0) / max(seconds, 1e-6))


def wait_for_quiet(limit_s: float, limits: NoiseLimits = NoiseLimits(), window_s: float = 2.0) -> HostWindow:
    """Wait (at most limit_s) for a window in which other processes use little CPU; return the last window."""
    deadline = time.monotonic() + limit_s
    while True:
        monitor = HostMonitor()
        monitor.start()
        time.sleep(window_s)
        window = monitor.stop()
        if not window.noisy(limits) or time.monotonic() >= deadline:
            return window


# ---- runqueue wait ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunqueueWait:
    """Time a set of processes spent runnable but not running over a window (schedstat)."""

    wait_s: float
    run_s: float
    seconds: float

    @property
    def wait_pct(self) -> float:
        """Runqueue wait as a share of the window (summed over threads: may pass 100)."""
        return 100.0 * self.wait_s / self.seconds if self.seconds > 0 else float("nan")

    @property
    def delay_pct(self) -> float:
        """Of the time the threads wanted a CPU (run + wait), the share spent waiting."""
        wanted = self.run_s + self.wait_s
        return 100.0 * self.wait_s / wanted if wanted > 0 else float("nan")


class WaitMeter:
    """Runqueue wait of named processes over a window. Threads are read by sampling (`sample()`
    while the window is open, `stop()` samples once more): a process or thread that exits keeps
    the last value read, so sample often enough for short-lived load generators."""

    def __init__(self) -> None:
        self._pids: Dict[str, List[int]] = {}
        self._base: Dict[int, Tuple[int, int]] = {}  # tid -> (run, wait) at start; new threads start at 0
        self._last: Dict[str, Dict[int, Tuple[int, int]]] = {}
        self._t0 = 0.0

    def start(self, **pids: Sequence[int]) -> None:
        """start(client=[pid], server=[pid]): the processes to follow, by label."""
        self._pids = {label: list(found) for label, found in pids.items()}
        self._t0 = time.monotonic()
        self._base = {}
        for found in self._pids.values():
            for pid in found:
                self._base.update(thread_schedstats(pid))
        self._last = {label: {} for label in self._pids}

    def follow(self, label: str, pid: int) -> None:
        """Add a process started after start() (its threads count from their birth)."""
        self._pids.setdefault(label, []).append(pid)
        self._last.setdefault(label, {})

    def sample(self) -> None:
        for label, found in self._pids.items():
            for pid in found:
                self._last[label].update(thread_schedstats(pid))

    def stop(self) -> Dict[str, RunqueueWait]:
        self.sample()
        seconds = time.monotonic() - self._t0
        out = {}
        for label, threads in self._last.items():
            run = wait = 0
            for tid, (r, w) in threads.items():
                r0, w0 = self._base.get(tid, (0, 0))
                run += r - r0
                wait += w - w0
            out[label] = RunqueueWait(wait / 1e9, run / 1e9, seconds)
        return out


def thread_schedstats(pid: int) -> Dict[int, Tuple[int, int]]:
    """tid -> (ns on a CPU, ns waiting on a runqueue) of the process's live threads."""
    return {tid: (found.run_ns, found.wait_ns) for tid in procfs.list_tids(pid) or ()
            if (found := procfs.read_schedstat(pid, tid)) is not None}


# ---- cgroups and spinners -----------------------------------------------------------------------------


class ScratchCgroup:
    """A fresh cgroup v2 directory of this process's own. No controller is enabled in it: it only
    names processes (for a [[binding]], a unit binding's equivalent without systemd). Leaving
    moves whatever is still in it back to the root and removes it."""

    def __init__(self, name: str, root: str = CGROUP2_ROOT):
        self.name = name
        self.root = root
        self.path = os.path.join(root, name)

    @property
    def relative(self) -> str:
        """The path as /proc/PID/cgroup and temperd.toml write it."""
        return "/" + self.name

    def add(self, pid: int) -> None:
        with open(os.path.join(self.path, "cgroup.procs"), "w") as handle:
            handle.write(str(pid))

    def pids(self) -> List[int]:
        with open(os.path.join(self.path, "cgroup.procs")) as handle:
            return [int(x) for x in handle.read().split()]

    def __enter__(self) -> "ScratchCgroup":
        os.makedirs(self.path, exist_ok=True)
        return self

    def __exit__(self, *exc) -> None:
        with contextlib.suppress(OSError):
            for pid in self.pids():
                with contextlib.suppress(OSError), open(os.path.join(self.root, "cgroup.procs"), "w") as handle:
                    handle.write(str(pid))
        with contextlib.suppress(OSError):
            os.rmdir(self.path)


def scratch_name(suffix: str) -> str:
    return f"temperd-trial-{os.getpid()}-{suffix}"


def spinner_argv(count: int, limit_s: float, metrics: Optional[str] = None) -> List[str]:
    """COUNT CPU-bound workers that stop by themselves after limit_s: stress-ng's int64 method where
    installed (what the published tables used), else Python processes spinning on the clock.
    metrics: a file where stress-ng writes its metrics (YAML) when it ends (bogo_ops_per_cpu_s)."""
    stress = shutil.which("stress-ng")
    seconds = max(1, int(round(limit_s)))
    if stress:
        return [stress, "--cpu", str(count), "--cpu-method", "int64", "--timeout", f"{seconds}s", "--quiet",
                *(("--metrics-brief", "--yaml", metrics) if metrics else ())]
    loop = ("import os,sys,time\n"
            "n,end=int(sys.argv[1]),time.monotonic()+float(sys.argv[2])\n"
            "kids=[os.fork() for _ in range(n)]\n"
            "if 0 in kids:\n"
            "    while time.monotonic()<end: pass\n"
            "    os._exit(0)\n"
            "for k in kids: os.waitpid(k,0)\n")
    return [sys.executable, "-c", loop, str(count), str(seconds)]


@contextlib.contextmanager
def spinners(count: int, limit_s: float, cgroup: Optional[ScratchCgroup] = None,
             wrapper: Sequence[str] = (), own_session: bool = False, metrics: Optional[str] = None) -> Iterator[List[int]]:
    """COUNT CPU spinners, bounded by limit_s, in their own process group (for cleanup) and in
    `cgroup`, started through `wrapper` (e.g. nice -n 19 chrt --idle 0); yields the spinning
    pids. They stay in the caller's session (its autogroup), as a batch job started beside it,
    unless own_session: a session (autogroup) of their own, as a service manager starts a job."""
    if count == 0:
        yield []
        return
    procs = os.path.join(cgroup.path, "cgroup.procs") if cgroup is not None else None

    def join() -> None:  # in the child, before exec: own process group or session, own cgroup
        if own_session:
            os.setsid()
        else:
            os.setpgrp()
        if procs:
            with open(procs, "w") as handle:
                handle.write("0")

    proc = subprocess.Popen([*wrapper, *spinner_argv(count, limit_s, metrics)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, preexec_fn=join)
    try:
        workers = wait_until(lambda: _spinning(proc.pid, count), 5.0, 0.02)
        if not workers:
            raise RuntimeError(f"{count} spinner(s) did not start within 5 s")
        yield workers
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


def bogo_ops_per_cpu_s(metrics: str) -> Optional[float]:
    """stress-ng's bogo-ops per second of its own CPU time (usr + sys), from the YAML it wrote when
    it ended (None: none written). A run's background work is its spinners' CPU seconds in the
    window times this."""
    try:
        with open(metrics) as handle:
            text = handle.read()
    except OSError:
        return None
    found = re.search(r"bogo-ops-per-second-usr-sys-time:\s*([0-9.eE+-]+)", text)
    return float(found.group(1)) if found else None


def _spinning(parent: int, count: int) -> Optional[List[int]]:
    kids = procfs.read_children(parent)
    return kids if len(kids) >= count else None


def wait_until(condition: Callable[[], object], timeout_s: float, interval_s: float = 0.05):
    """condition() until truthy or timeout; returns the last value."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(interval_s)


# ---- arms, runs and their order -------------------------------------------------------------------------


@dataclass(frozen=True)
class Arm:
    """One way of scheduling the host for a run. `enter()` puts it in force (start a daemon with
    some configuration, pin a server...) and yields notes to keep with the run; it is left before
    the next arm enters, so every arm starts from the same host. Spinners of the run are started
    through `spinner_wrapper` (an operator's `nice -n 19 chrt --idle 0`) once the arm is in force."""

    name: str
    description: str
    enter: Callable[[], ContextManager[Dict[str, object]]]
    spinner_wrapper: Tuple[str, ...] = ()
    # Around the measured window only (e.g. a scheduler's own stats over it): fills the notes it yields.
    during: Optional[Callable[[], ContextManager[Dict[str, object]]]] = None


@dataclass
class Run:
    """One measurement: which step (e.g. the spinner count), arm and repetition, what the workload
    reported (`metrics`, e.g. rps, p99_ms), the host around it and the runqueue wait of the
    processes followed."""

    step: str
    arm: str
    rep: int
    metrics: Dict[str, float] = field(default_factory=dict)
    window: Optional[HostWindow] = None
    waits: Dict[str, RunqueueWait] = field(default_factory=dict)
    notes: Dict[str, object] = field(default_factory=dict)  # what the arm and workload want kept
    noisy: bool = False
    retried: bool = False
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error


def arm_order(arms: Sequence[str], rep: int) -> Tuple[str, ...]:
    """The order of the arms in repetition `rep`: as given, reversed every other repetition."""
    return tuple(arms) if rep % 2 == 0 else tuple(reversed(arms))


class OutOfTime(Exception):
    pass


@dataclass
class TrialPlan:
    """Steps in order, the arms of each step, repetitions, and how noisy runs are handled."""

    steps: Sequence[str]
    arms_of: Callable[[str], Sequence[str]]
    reps: int = 3
    limits: NoiseLimits = NoiseLimits()
    max_retries: int = 8  # noisy runs repeated, in all
    deadline: Optional[float] = None  # time.monotonic() after which no run starts


def run_trials(plan: TrialPlan, measure: Callable[[str, str, int], Run],
               progress: Callable[[Run], None] = lambda run: None) -> List[Run]:
    """Every step, every arm, every repetition: repetitions outermost, so a repetition covers the
    whole ladder before the next starts and drift over time hits every step and arm. A noisy run
    is repeated once while the retry budget lasts; the quieter of the two is kept. Raises
    OutOfTime (carrying the runs so far in .args[0]) when the deadline passes."""
    runs: List[Run] = []
    retries = 0
    for rep in range(plan.reps):
        for step in plan.steps:
            for arm in arm_order(plan.arms_of(step), rep):
                if plan.deadline is not None and time.monotonic() >= plan.deadline:
                    raise OutOfTime(runs)
                run = measure(step, arm, rep)
                run.noisy = run.ok and run.window is not None and run.window.noisy(plan.limits)
                if run.noisy and retries < plan.max_retries:
                    retries += 1
                    again = measure(step, arm, rep)
                    again.noisy = again.ok and again.window is not None and again.window.noisy(plan.limits)
                    again.retried = True
                    if again.ok and (not again.noisy or _foreign(again) <= _foreign(run)):
                        run = again
                    else:
                        run.retried = True
                runs.append(run)
                progress(run)
    return runs


def _foreign(run: Run) -> float:
    return run.window.foreign_core_pct if run.window is not None else float("inf")


def summarise(runs: Iterable[Run], metric: str) -> Dict[Tuple[str, str], Spread]:
    """(step, arm) -> the spread of `metric` over its good runs."""
    groups: Dict[Tuple[str, str], List[float]] = {}
    for run in runs:
        if run.ok:
            groups.setdefault((run.step, run.arm), []).append(run.metrics.get(metric, float("nan")))
    return {key: spread(values) for key, values in groups.items()}

