"""Shared helpers for the benchmarks: running temperd from a throwaway config directory and a
host description. The trial machinery (host noise, spinners, runqueue wait, interleaved arms,
medians and comparisons) is temperd.training.harness, re-exported here for the scripts.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Iterator, List, Mapping, Optional, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
for _path in (ROOT, os.path.join(ROOT, "tests")):
    if _path not in sys.path:
        sys.path.insert(0, _path)

from temperd.control import client  # noqa: E402
from temperd.control.protocol import DaemonUnavailable  # noqa: E402
from temperd.sources import procfs  # noqa: E402
from temperd.sources.shape import format_cpulist, read_shape  # noqa: E402
from temperd.training.harness import (  # noqa: E402,F401  (re-exported for the bench scripts)
    CGROUP2_ROOT, TICK_HZ, HostMonitor, HostWindow, NoiseLimits, median, wait_for_quiet, wait_until,
)
from temperd.training.harness import thread_schedstats  # noqa: E402

BINDIR = os.path.dirname(sys.executable)


def read_text(path: str, default: str = "") -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read().strip()
    except OSError:
        return default


def thread_runtime_ns(pid: int) -> int:
    """Run time of the live threads (ns)."""
    return sum(run for run, _wait in thread_schedstats(pid).values())


def last_cpu(pid: int) -> Optional[int]:
    """The CPU the process's main thread last ran on."""
    stat = procfs.read_thread_stat(pid)
    return stat.last_cpu if stat is not None else None


def load_average() -> float:
    return float(read_text("/proc/loadavg", "0").split()[0])


def stuck_report(pids: Sequence[int], log_paths: Sequence[str] = ()) -> str:
    """What a run that hung leaves to read, taken while it hangs: sched_ext's state, every thread of
    `pids` and their children and every thread in the kernel's uninterruptible sleep (D) anywhere,
    each with its wait channel and kernel stack (root only), and the ends of `log_paths`."""
    lines = [f"sched_ext: state {read_text('/sys/kernel/sched_ext/state', '-')}, "
             f"ops {read_text('/sys/kernel/sched_ext/root/ops', '-')}"]
    watched = set(pids)
    for pid in list(watched):
        watched.update(int(c) for c in read_text(f"/proc/{pid}/task/{pid}/children").split())
    for pid in sorted(int(p) for p in os.listdir("/proc") if p.isdigit()):
        try:
            tids = sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))
        except OSError:  # gone meanwhile
            continue
        for tid in tids:
            stat = read_text(f"/proc/{pid}/task/{tid}/stat")
            state = stat.rpartition(")")[2].split()[:1]
            if pid not in watched and state != ["D"]:
                continue
            comm = stat[stat.find("(") + 1:stat.rfind(")")]
            stack = " <- ".join(frame.split()[-1] for frame in read_text(f"/proc/{pid}/task/{tid}/stack").splitlines())
            lines.append(f"  {pid}/{tid} {comm} state {''.join(state) or '?'} wchan "
                         f"{read_text(f'/proc/{pid}/task/{tid}/wchan', '-')}: {stack or '(no stack)'}")
    for path in log_paths:
        lines.append(f"the end of {os.path.basename(path)}:\n{read_text(path)[-3000:] or '(empty or absent)'}")
    return "\n".join(lines)


# ---- the host ---------------------------------------------------------------------------------------


def host_description() -> str:
    shape = read_shape()
    hypervisor = "hypervisor" in read_text("/proc/cpuinfo")
    vendor = read_text("/sys/class/dmi/id/sys_vendor") or read_text("/sys/class/dmi/id/product_name")
    governor = read_text("/sys/devices/system/cpu/cpuidle/current_governor_ro") or \
        read_text("/sys/devices/system/cpu/cpuidle/current_governor") or "none"
    autogroup = read_text("/proc/sys/kernel/sched_autogroup_enabled", "?")
    smt = read_text("/sys/devices/system/cpu/smt/active", "?")
    virt = "VM" + (f" ({vendor})" if vendor else "") if hypervisor else "bare metal"
    return (f"{platform.node()}: Linux {platform.release()}, {virt}, CPUs {format_cpulist(shape.cpus)} "
            f"({shape.cpu_model}), SMT active {smt}, cpuidle governor {governor}, autogroup {autogroup}")


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
    ready_after_s: Optional[float] = None  # from its start until its control socket first answered

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def status(self, timeout: float = 60.0) -> dict:
        out = subprocess.run([os.path.join(BINDIR, "temperctl"), "status", "--json", "--socket", self.socket],
                             capture_output=True, text=True, timeout=timeout)
        if out.returncode != 0:
            raise RuntimeError(f"temperctl status failed ({out.returncode}): {out.stderr.strip()[-300:]}")
        return json.loads(out.stdout)

    def log_tail(self, chars: int = 2000) -> str:
        return read_text(self.log_path)[-chars:]

    def cpu_ticks(self) -> int:
        return procfs.read_process_cpu_ticks(self.pid) or 0

    def stop(self, timeout: float = 60.0) -> Optional[int]:
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


def tree_command(tree: Optional[str]) -> Optional[List[str]]:
    """running_temperd's `command` that runs the temperd package of another checkout (None: this one's)."""
    if not tree:
        return None
    path = os.path.abspath(tree)
    return [sys.executable, "-c", f"import sys; sys.path.insert(0, {path!r}); "
            "from temperd.daemon.main import main; sys.exit(main())"]


@contextlib.contextmanager
def running_temperd(*, bindings: str = "", profiles: Optional[Mapping[str, str]] = None, http_port: int = 0,
                    log_level: str = "warning", settings: str = "", command: Optional[Sequence[str]] = None,
                    env: Optional[Mapping[str, str]] = None, ready_timeout_s: float = 60.0,
                    backend: str = "native") -> Iterator[TemperdProcess]:
    """temperd (the native backend unless `backend` says otherwise) in the foreground with its own
    config dir, state dir and control socket; `bindings` is TOML appended to temperd.toml
    ([[binding]] tables), `profiles` maps file names to profile TOML for profiles.d, `command`
    replaces the temperd executable (a profiler wrapper). Ready = the control socket answers a
    status request (temperd serves it once the first plan is applied; the file exists from the
    start, and on a crowded host the start may take long; with backend "scx", scx_layered may
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
    failed = False
    try:
        deadline = time.monotonic() + ready_timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"temperd exited with status {proc.returncode}: {daemon.log_tail()}")
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"temperd did not answer on its control socket within {ready_timeout_s:.0f} s")
            try:
                client.request(socket_path, "status", timeout=left)
                break
            except DaemonUnavailable:  # not bound yet, or still starting
                time.sleep(0.02)
        daemon.ready_after_s = round(time.monotonic() - daemon.started_at, 1)
        yield daemon
    except BaseException:
        failed = True
        if proc.poll() is None:  # taken while it hangs, before the stop below ends it
            sys.stderr.write(f"temperd pid {daemon.pid} still runs after the failure; what it and the kernel were doing:\n"
                             f"{stuck_report([daemon.pid], [os.path.join(state_dir, 'scx_layered.log')])}\n")
        raise
    finally:
        try:
            daemon.stop()
        except subprocess.SubprocessError:
            failed = True
            raise
        finally:
            if failed:  # what temperd said, before its directory goes
                tail = daemon.log_tail().strip() or "(empty)"
                sys.stderr.write(f"temperd pid {daemon.pid}, a run that failed or did not stop: the end of its log:\n{tail}\n")
            log.close()
            shutil.rmtree(workdir, ignore_errors=True)


def thread_affinities(pid: int) -> List[frozenset]:
    """The CPU affinity of each thread of a process (those it could read)."""
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return []
    return [found for found in map(affinity_of, tids) if found]


def affinity_of(pid: int) -> Optional[frozenset]:
    try:
        return frozenset(os.sched_getaffinity(pid))
    except OSError:
        return None


def cpulist(cpus) -> str:
    return ",".join(str(c) for c in sorted(cpus)) if cpus else "-"


def py_spy_record(pid: int, seconds: float, out: str, binary: Optional[str] = None) -> subprocess.Popen:
    """py-spy sampling every thread of `pid` for `seconds` (raw collapsed stacks into `out`);
    --nonblocking so that the profiler does not stop the daemon it measures. The binary: the
    one given, else the one installed beside this Python, else py-spy on PATH."""
    if binary is None:
        beside = os.path.join(BINDIR, "py-spy")
        binary = beside if os.path.exists(beside) else "py-spy"
    return subprocess.Popen([binary, "record", "--pid", str(pid), "--rate", "200", "--duration",
                             str(max(1, int(seconds))), "--format", "raw", "--threads", "--nonblocking",
                             "--output", out], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)


def print_py_spy(path: str, top: int = 20) -> None:
    """py-spy raw output: one `frame;frame;... count` line per distinct stack, each frame
    `function (file:line)`. Prints each function's inclusive share (anywhere on the stack, its
    lines together) and its own share (the innermost frame)."""
    inclusive, own, total = {}, {}, 0
    with open(path) as handle:
        for line in handle:
            stack, _, count = line.rstrip().rpartition(" ")
            if not stack:
                continue
            n = int(count)
            total += n
            frames = [re.sub(r":\d+\)$", ")", frame) for frame in stack.split(";")]
            for frame in set(frames):
                inclusive[frame] = inclusive.get(frame, 0) + n
            own[frames[-1]] = own.get(frames[-1], 0) + n
    print(f"\npy-spy samples (all threads, idle threads included): {total}")
    print("inclusive:")
    for frame, n in sorted(inclusive.items(), key=lambda kv: -kv[1])[:top]:
        print(f"{100.0 * n / max(total, 1):6.1f} %  {frame}")
    print("own (innermost frame):")
    for frame, n in sorted(own.items(), key=lambda kv: -kv[1])[:top // 2]:
        print(f"{100.0 * n / max(total, 1):6.1f} %  {frame}")
