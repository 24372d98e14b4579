"""Shared helpers for the benchmarks: running temperd from a throwaway config directory, host
noise (idle, steal, CPU of processes that are not part of the benchmark) and a host description.

Everything here reads /proc and /sys directly; nothing is cached between calls.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
for _path in (ROOT, os.path.join(ROOT, "tests")):
    if _path not in sys.path:
        sys.path.insert(0, _path)

BINDIR = os.path.dirname(sys.executable)
TICK_HZ = os.sysconf("SC_CLK_TCK")
PF_KTHREAD = 0x00200000
CGROUP2_ROOT = "/sys/fs/cgroup/unified" if os.path.isdir("/sys/fs/cgroup/unified") else "/sys/fs/cgroup"


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def read_text(path: str, default: str = "") -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read().strip()
    except OSError:
        return default


# ---- /proc/PID/stat -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ProcStat:
    pid: int
    comm: str
    ppid: int
    flags: int
    cpu_ticks: int  # utime + stime, all threads, exited threads included
    processor: int  # CPU it last ran on

    @property
    def kernel_thread(self) -> bool:
        return bool(self.flags & PF_KTHREAD)


def read_stat(pid: int, tid: Optional[int] = None) -> Optional[ProcStat]:
    path = f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat"
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError:
        return None
    try:
        close = data.rindex(b")")
        comm = data[data.index(b"(") + 1:close].decode("utf-8", "replace")
        rest = data[close + 2:].split()
        # rest[0] is field 3 (state): field N is rest[N - 3]
        return ProcStat(pid, comm, int(rest[1]), int(rest[6]), int(rest[11]) + int(rest[12]), int(rest[36]))
    except (ValueError, IndexError):
        return None


def all_stats() -> Dict[int, ProcStat]:
    out: Dict[int, ProcStat] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            stat = read_stat(int(name))
            if stat is not None:
                out[stat.pid] = stat
    return out


def descendants(root: int, stats: Mapping[int, ProcStat]) -> set:
    """root and every process below it (by ppid)."""
    children: Dict[int, List[int]] = {}
    for stat in stats.values():
        children.setdefault(stat.ppid, []).append(stat.pid)
    out, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid not in out:
            out.add(pid)
            todo.extend(children.get(pid, ()))
    return out


def schedstat_totals(pid: int) -> Tuple[int, int]:
    """(run ns, runqueue wait ns) summed over the live threads' /proc/PID/task/*/schedstat
    (exited threads are not in it)."""
    run = wait = 0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0, 0
    for tid in tids:
        fields = read_text(f"/proc/{pid}/task/{tid}/schedstat").split()
        if len(fields) >= 2:
            run += int(fields[0])
            wait += int(fields[1])
    return run, wait


def thread_runtime_ns(pid: int) -> int:
    """Run time of the live threads (ns)."""
    return schedstat_totals(pid)[0]


# ---- host noise -----------------------------------------------------------------------------------


def read_cpu_line() -> Tuple[int, ...]:
    """The aggregate `cpu` line of /proc/stat: user nice system idle iowait irq softirq steal (ticks)."""
    with open("/proc/stat") as handle:
        fields = handle.readline().split()
    return tuple(int(x) for x in fields[1:9])


@dataclass(frozen=True)
class HostWindow:
    """What the host did during one measurement window."""

    seconds: float
    idle_pct: float  # of all CPUs (idle + iowait)
    steal_pct: float  # of all CPUs: time the hypervisor ran something else
    foreign_core_pct: float  # user-space processes outside the benchmark, % of one core
    foreign_top: str  # the busiest foreign process, "comm pct"

    def noisy(self, foreign_limit_pct: float, steal_limit_pct: float) -> bool:
        return self.foreign_core_pct > foreign_limit_pct or self.steal_pct > steal_limit_pct


class HostMonitor:
    """Idle and steal from /proc/stat deltas; foreign CPU = utime+stime deltas of user-space
    processes that are not descendants of `ours` (the benchmark process by default). Processes
    that start and exit inside the window are not seen; kernel threads are left out (they mostly
    work for the benchmark: softirq for loopback traffic)."""

    def __init__(self, ours: Optional[int] = None):
        self.ours = ours if ours is not None else os.getpid()
        self._t0 = 0.0
        self._cpu0: Tuple[int, ...] = ()
        self._stats0: Dict[int, ProcStat] = {}

    def start(self) -> None:
        self._stats0 = all_stats()
        self._cpu0 = read_cpu_line()
        self._t0 = time.monotonic()

    def stop(self) -> HostWindow:
        cpu1 = read_cpu_line()
        seconds = time.monotonic() - self._t0
        stats1 = all_stats()
        delta = [b - a for a, b in zip(self._cpu0, cpu1)]
        total = sum(delta) or 1
        idle = 100.0 * (delta[3] + delta[4]) / total
        steal = 100.0 * delta[7] / total
        ours = descendants(self.ours, stats1) | descendants(self.ours, self._stats0)
        foreign: Dict[int, int] = {}
        for pid, stat in stats1.items():
            if pid in ours or stat.kernel_thread or pid == 2 or stat.ppid == 2:
                continue
            before = self._stats0.get(pid)
            start = before.cpu_ticks if before is not None and before.comm == stat.comm else 0
            used = stat.cpu_ticks - start
            if used > 0:
                foreign[pid] = used
        ticks = sum(foreign.values())
        top = ""
        if foreign:
            pid = max(foreign, key=foreign.get)
            top = f"{stats1[pid].comm} {100.0 * foreign[pid] / TICK_HZ / seconds:.0f}%"
        return HostWindow(seconds, idle, steal, 100.0 * ticks / TICK_HZ / max(seconds, 1e-6), top)


def load_average() -> float:
    return float(read_text("/proc/loadavg", "0").split()[0])


def wait_for_quiet(limit_s: float, max_load: float = 0.5, window_s: float = 2.0,
                   foreign_limit_pct: float = 10.0) -> HostWindow:
    """Wait (at most limit_s) for a window in which other processes use little CPU; return the last window."""
    deadline = time.monotonic() + limit_s
    while True:
        monitor = HostMonitor()
        monitor.start()
        time.sleep(window_s)
        window = monitor.stop()
        if window.foreign_core_pct <= foreign_limit_pct or time.monotonic() >= deadline:
            return window


# ---- the host ---------------------------------------------------------------------------------------


def host_description() -> str:
    model = ""
    for line in read_text("/proc/cpuinfo").splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    hypervisor = "hypervisor" in read_text("/proc/cpuinfo")
    vendor = read_text("/sys/class/dmi/id/sys_vendor") or read_text("/sys/class/dmi/id/product_name")
    online = read_text("/sys/devices/system/cpu/online")
    governor = read_text("/sys/devices/system/cpu/cpuidle/current_governor_ro") or \
        read_text("/sys/devices/system/cpu/cpuidle/current_governor") or "none"
    autogroup = read_text("/proc/sys/kernel/sched_autogroup_enabled", "?")
    smt = read_text("/sys/devices/system/cpu/smt/active", "?")
    virt = "VM" + (f" ({vendor})" if vendor else "") if hypervisor else "bare metal"
    return (f"{platform.node()}: Linux {platform.release()}, {virt}, CPUs {online} ({model}), SMT active {smt}, "
            f"cpuidle governor {governor}, autogroup {autogroup}")


# ---- temperd from a throwaway config directory ----------------------------------------------------


@dataclass
class TemperdProcess:
    proc: subprocess.Popen
    workdir: str
    config_dir: str
    socket: str
    http_port: int
    log_path: str
    started_at: float = field(default_factory=time.monotonic)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def status(self, timeout: float = 20.0) -> dict:
        out = subprocess.run([os.path.join(BINDIR, "temperctl"), "status", "--json", "--socket", self.socket],
                             capture_output=True, text=True, timeout=timeout)
        if out.returncode != 0:
            raise RuntimeError(f"temperctl status failed ({out.returncode}): {out.stderr.strip()[-300:]}")
        return json.loads(out.stdout)

    def log_tail(self, chars: int = 2000) -> str:
        return read_text(self.log_path)[-chars:]

    def cpu_ticks(self) -> int:
        stat = read_stat(self.pid)
        return stat.cpu_ticks if stat else 0

    def stop(self, timeout: float = 20.0) -> Optional[int]:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode


def temperd_toml(state_dir: str, socket: str, http_port: int = 0, extra: str = "", backend: str = "native") -> str:
    return (f'backend = "{backend}"\nstate_dir = "{state_dir}"\n{extra}'
            f'[http]\nport = {http_port}\n[control]\nsocket = "{socket}"\n')


@contextlib.contextmanager
def running_temperd(*, bindings: str = "", profiles: Optional[Mapping[str, str]] = None, http_port: int = 0,
                    log_level: str = "warning", settings: str = "", command: Optional[Sequence[str]] = None,
                    env: Optional[Mapping[str, str]] = None, ready_timeout_s: float = 20.0,
                    backend: str = "native") -> Iterator[TemperdProcess]:
    """temperd (the native backend unless `backend` says otherwise) in the foreground with its own
    config dir, state dir and control socket; `bindings` is TOML appended to temperd.toml
    ([[binding]] tables), `profiles` maps file names to profile TOML for profiles.d, `command`
    replaces the temperd executable (a profiler wrapper). Ready = the control socket exists (the
    first plan has been applied before the socket is served; with backend "scx", scx_layered may
    still be attaching). Stopped with SIGTERM on exit (restores)."""
    workdir = tempfile.mkdtemp(prefix="temperd-bench-")
    config_dir = os.path.join(workdir, "etc")
    state_dir = os.path.join(workdir, "run")
    os.makedirs(os.path.join(config_dir, "profiles.d"))
    socket_path = os.path.join(state_dir, "temperd.sock")
    with open(os.path.join(config_dir, "temperd.toml"), "w") as handle:
        handle.write(temperd_toml(state_dir, socket_path, http_port, settings, backend) + bindings)
    for name, text in (profiles or {}).items():
        with open(os.path.join(config_dir, "profiles.d", name), "w") as handle:
            handle.write(text)
    log_path = os.path.join(workdir, "temperd.log")
    log = open(log_path, "w")
    argv = [*(command or [os.path.join(BINDIR, "temperd")]), "--config", config_dir, "--log-level", log_level]
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            env=dict(os.environ, **(env or {})))
    daemon = TemperdProcess(proc, workdir, config_dir, socket_path, http_port, log_path)
    try:
        deadline = time.monotonic() + ready_timeout_s
        while not os.path.exists(socket_path):
            if proc.poll() is not None:
                raise RuntimeError(f"temperd exited with status {proc.returncode}: {daemon.log_tail()}")
            if time.monotonic() >= deadline:
                raise RuntimeError(f"temperd did not serve its control socket within {ready_timeout_s:.0f} s")
            time.sleep(0.02)
        yield daemon
    finally:
        daemon.stop()
        log.close()
        shutil.rmtree(workdir, ignore_errors=True)


def wait_until(condition, timeout_s: float, interval_s: float = 0.05):
    """condition() until truthy or timeout; returns the last value."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(interval_s)


def affinity_of(pid: int) -> Optional[frozenset]:
    try:
        return frozenset(os.sched_getaffinity(pid))
    except OSError:
        return None


def cpulist(cpus) -> str:
    return ",".join(str(c) for c in sorted(cpus)) if cpus else "-"
