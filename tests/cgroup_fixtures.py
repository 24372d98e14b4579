"""Real processes in cgroups of their own, for the classification and rightsizing tests: a cgroup
under a per-test parent on the cgroup v2 tree (the root on unified hosts, unified/ on hybrid
ones), with a CPU quota and a memory bound through v2 (cpu.max, memory.high) where the
controllers are there, else through the v1 controllers at the same path (cpu.cfs_quota_us,
memory.limit_in_bytes; without memory.high's throttling a v1 limit needs swap to stall rather
than OOM-kill, so `swap` adds a temporary swap file where the host has none)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from typing import Iterator, List, Optional

ROOT = "/sys/fs/cgroup"


def v2_root() -> str:
    return ROOT if os.path.exists(os.path.join(ROOT, "cgroup.controllers")) else os.path.join(ROOT, "unified")


def _v2_has(controller: str) -> bool:
    with open(os.path.join(v2_root(), "cgroup.controllers")) as handle:
        return controller in handle.read().split()


def _write(path: str, text: str) -> None:
    with open(path, "w") as handle:
        handle.write(text)


class FixtureCgroup:
    def __init__(self, parent: str, name: str):
        self.path = f"{parent}/{name}"  # the cgroup v2 path temperd sees
        self.dirs: List[str] = [os.path.join(v2_root(), self.path.lstrip("/"))]
        os.makedirs(self.dirs[0], exist_ok=True)
        self.procs: List[subprocess.Popen] = []

    def _v1(self, controller: str) -> str:
        directory = os.path.join(ROOT, controller, self.path.lstrip("/"))
        os.makedirs(directory, exist_ok=True)
        if directory not in self.dirs:
            self.dirs.append(directory)
        return directory

    def _enable(self, controller: str) -> None:
        """Let this cgroup use a v2 controller: +controller in each ancestor's subtree_control."""
        parts = self.path.strip("/").split("/")
        for depth in range(len(parts)):
            _write(os.path.join(v2_root(), *parts[:depth], "cgroup.subtree_control"), f"+{controller}")

    def cpu_max(self, cpus: float, period_us: int = 100_000) -> None:
        quota = int(cpus * period_us)
        if _v2_has("cpu"):
            self._enable("cpu")
            _write(os.path.join(self.dirs[0], "cpu.max"), f"{quota} {period_us}")
        else:
            directory = self._v1("cpu")
            _write(os.path.join(directory, "cpu.cfs_period_us"), str(period_us))
            _write(os.path.join(directory, "cpu.cfs_quota_us"), str(quota))

    def cpu_weight_times(self, factor: int) -> None:
        """factor times the default CPU weight (cpu.weight 100 on v2, cpu.shares 1024 on v1)."""
        if _v2_has("cpu"):
            self._enable("cpu")
            _write(os.path.join(self.dirs[0], "cpu.weight"), str(100 * factor))
        else:
            _write(os.path.join(self._v1("cpu"), "cpu.shares"), str(1024 * factor))

    def memory_bound(self, limit_bytes: int) -> str:
        """memory.high on v2; memory.limit_in_bytes on v1. Which one, for messages."""
        if _v2_has("memory"):
            self._enable("memory")
            _write(os.path.join(self.dirs[0], "memory.high"), str(limit_bytes))
            return "memory.high"
        _write(os.path.join(self._v1("memory"), "memory.limit_in_bytes"), str(limit_bytes))
        return "memory.limit_in_bytes (v1)"

    def spawn(self, argv: List[str], **popen) -> subprocess.Popen:
        """Started inside the cgroup (every hierarchy set up so far) before it execs."""
        dirs = list(self.dirs)

        def enter() -> None:
            for directory in dirs:
                _write(os.path.join(directory, "cgroup.procs"), str(os.getpid()))

        proc = subprocess.Popen(argv, preexec_fn=enter, stdin=subprocess.DEVNULL, **popen)
        self.procs.append(proc)
        return proc

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        for directory in reversed(self.dirs):
            _kill_remaining(directory)
            _rmdir(directory)


def _kill_remaining(directory: str) -> None:
    """stress-ng's workers and anything else still in the cgroup."""
    for _ in range(50):
        try:
            with open(os.path.join(directory, "cgroup.procs")) as handle:
                pids = [int(p) for p in handle.read().split()]
        except OSError:
            return
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)


def _rmdir(directory: str) -> None:
    for _ in range(50):
        try:
            os.rmdir(directory)
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.1)


@contextlib.contextmanager
def cgroup_parent(name: str) -> Iterator[str]:
    """A parent cgroup path for one test's fixtures; everything under it is removed afterwards."""
    path = f"/{name}-{os.getpid()}"
    made: List[FixtureCgroup] = []
    os.makedirs(os.path.join(v2_root(), path.lstrip("/")), exist_ok=True)

    def make(child: str) -> FixtureCgroup:
        cgroup = FixtureCgroup(path, child)
        made.append(cgroup)
        return cgroup

    try:
        yield make  # type: ignore[misc]
    finally:
        for cgroup in made:
            cgroup.close()
        for base in {v2_root(), *(os.path.join(ROOT, c) for c in ("cpu", "memory", "cpu,cpuacct"))}:
            _rmdir(os.path.join(base, path.lstrip("/")))


def swap_is_on() -> bool:
    with open("/proc/swaps") as handle:
        return len(handle.read().splitlines()) > 1


@contextlib.contextmanager
def temporary_swap(directory: str, size_mib: int = 512) -> Iterator[Optional[str]]:
    """A swap file for the test's duration where the host has no swap (None where it has)."""
    if swap_is_on():
        yield None
        return
    path = os.path.join(directory, "temperd-test.swap")
    subprocess.run(["fallocate", "-l", f"{size_mib}M", path], check=True)
    os.chmod(path, 0o600)
    subprocess.run(["mkswap", "-q", path], check=True)
    subprocess.run(["swapon", path], check=True)
    try:
        yield path
    finally:
        subprocess.run(["swapoff", path], check=False)
        with contextlib.suppress(OSError):
            os.unlink(path)


def needs(tool: str) -> Optional[str]:
    """Why a test cannot run without this tool, or None."""
    return None if shutil.which(tool) else f"{tool} is not installed (scripts/test.sh installs it)"
