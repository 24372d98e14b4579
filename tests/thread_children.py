"""Child processes with named threads for scheduler tests, and /proc readback helpers.

A child names each thread with prctl(PR_SET_NAME) from inside the thread, reports
{"pid", "threads": {name: tid}} on stdout, then serves "spawn NAME" / "spin SECONDS" lines on
stdin. It exits when stdin closes or after a bounded lifetime, so a crashed test leaves nothing.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Dict, List

import pytest

from temperd.sources.shape import online_cpus

CHILD_LIFETIME_S = 120

CHILD_SCRIPT = r"""
import ctypes, json, os, select, sys, threading, time
libc = ctypes.CDLL(None)
stop = threading.Event()
lock = threading.Lock()
named = {}
def worker(name, spin_s):
    libc.prctl(15, name.encode(), 0, 0, 0)
    with lock:
        named[name] = threading.get_native_id()
    if spin_s:
        end = time.monotonic() + spin_s
        while time.monotonic() < end and not stop.is_set():
            pass
    stop.wait(%(lifetime)d)
def start(name, spin_s=0.0):
    threading.Thread(target=worker, args=(name, spin_s), daemon=True).start()
    while name not in named:
        time.sleep(0.002)
    return named[name]
spin_s = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
for name in [n for n in sys.argv[1].split(",") if n]:
    start(name, spin_s)
print(json.dumps({"pid": os.getpid(), "threads": named}), flush=True)
deadline = time.monotonic() + %(lifetime)d
while time.monotonic() < deadline:
    ready, _, _ = select.select([sys.stdin], [], [], 1.0)
    if not ready:
        continue
    line = sys.stdin.readline()
    if not line:
        break
    cmd, _, arg = line.strip().partition(" ")
    if cmd == "spawn":
        print(json.dumps({"tid": start(arg)}), flush=True)
stop.set()
""" % {"lifetime": CHILD_LIFETIME_S}


@dataclass
class Child:
    proc: subprocess.Popen
    pid: int
    threads: Dict[str, int]

    def spawn(self, name: str) -> int:
        """A new named thread in this child; returns its tid."""
        self.proc.stdin.write(f"spawn {name}\n")
        self.proc.stdin.flush()
        reply = read_json_line(self.proc, 10)
        self.threads[name] = reply["tid"]
        return reply["tid"]

    def tids(self) -> List[int]:
        return sorted(int(t) for t in os.listdir(f"/proc/{self.pid}/task"))


def read_json_line(proc: subprocess.Popen, timeout_s: float) -> dict:
    ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
    if not ready:
        raise TimeoutError("child did not answer")
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"child exited: {proc.poll()}")
    return json.loads(line)


@dataclass
class Children:
    """Spawns children; kill_all() ends them (fixture finalizer)."""

    procs: List[subprocess.Popen] = field(default_factory=list)

    def spawn(self, names: List[str], new_session: bool = True, spin_s: float = 0.0) -> Child:
        proc = subprocess.Popen([sys.executable, "-c", CHILD_SCRIPT, ",".join(names), str(spin_s)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                start_new_session=new_session)
        self.procs.append(proc)
        info = read_json_line(proc, 20)
        return Child(proc, info["pid"], {k: int(v) for k, v in info["threads"].items()})

    def kill_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
            for stream in (proc.stdin, proc.stdout):
                try:
                    stream.close()
                except OSError:
                    pass
        self.procs.clear()


# ---- /proc readback ------------------------------------------------------------------------------


def cpus_allowed(pid: int, tid: int) -> str:
    with open(f"/proc/{pid}/task/{tid}/status") as handle:
        for line in handle:
            if line.startswith("Cpus_allowed_list:"):
                return line.split(":", 1)[1].strip()
    raise AssertionError("no Cpus_allowed_list")


def stat_field(pid: int, tid: int, number: int) -> int:
    """Field `number` of proc(5)'s stat numbering (19 nice, 41 policy)."""
    with open(f"/proc/{pid}/task/{tid}/stat") as handle:
        data = handle.read()
    fields = data[data.rindex(")") + 2:].split()
    return int(fields[number - 3])


def nice_of(pid: int, tid: int) -> int:
    return stat_field(pid, tid, 19)


def policy_of(pid: int, tid: int) -> int:
    return stat_field(pid, tid, 41)


def snapshot(pid: int) -> Dict[int, tuple]:
    """(Cpus_allowed_list, policy, nice) per thread of a process."""
    out = {}
    for tid in sorted(int(t) for t in os.listdir(f"/proc/{pid}/task")):
        out[tid] = (cpus_allowed(pid, tid), policy_of(pid, tid), nice_of(pid, tid))
    return out


def cpu_ticks(pid: int) -> int:
    """utime + stime of a whole process, in clock ticks."""
    with open(f"/proc/{pid}/stat") as handle:
        data = handle.read()
    fields = data[data.rindex(")") + 2:].split()
    return int(fields[11]) + int(fields[12])


def ticks_used_until(pids, total: int, timeout: float = 10.0) -> Dict[int, int]:
    """CPU ticks each process used from now until together they used `total`: a measuring window
    that ends on what ran, not on the clock, so a crowded host makes it longer, never thinner."""
    start = {pid: cpu_ticks(pid) for pid in pids}

    def used() -> Dict[int, int]:
        return {pid: cpu_ticks(pid) - start[pid] for pid in pids}
    wait_for(lambda: sum(used().values()) >= total, timeout, f"{total} ticks of CPU used by {sorted(pids)}")
    return used()


def tree_ticks(pid: int) -> int:
    """utime + stime of a process and its living descendants, in clock ticks (0 once it is gone)."""
    import psutil

    try:
        procs = [psutil.Process(pid)]
        procs += procs[0].children(recursive=True)
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for proc in procs:
        try:
            total += cpu_ticks(proc.pid)
        except (OSError, ValueError):
            continue  # exited since listed
    return total


def busy_until(pid: int, total: int, timeout: float = 20.0) -> None:
    """Until a server (with the processes it forks per connection) used `total` ticks of CPU from
    now: its clients are connected and served."""
    start = tree_ticks(pid)
    wait_for(lambda: tree_ticks(pid) - start >= total, timeout, f"{total} ticks of CPU used by pid {pid}'s tree",
             step=0.1)


def wait_until(predicate, timeout_s: float = 5.0, step_s: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step_s)
    return predicate()


def wait_for(condition, timeout: float = 10.0, what: str = "condition", step: float = 0.05):
    """condition()'s first truthy value within timeout seconds, asked every `step` seconds (a
    condition that runs a command asks less often, so as not to load what it measures);
    AssertionError naming `what` otherwise."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(min(step, max(0.0, deadline - time.monotonic())))
    raise AssertionError(f"timed out waiting for {what}")


def holds(condition, seconds: float, what: str, step: float = 0.05) -> None:
    """condition() true at every `step` for `seconds`: for what must stay true through a span that
    the code under test measures on its own clock (a retry interval, say); AssertionError naming
    `what` at the first read that is false."""
    deadline = time.monotonic() + seconds
    while True:
        assert condition(), f"no longer true: {what}"
        if time.monotonic() >= deadline:
            return
        time.sleep(min(step, max(0.0, deadline - time.monotonic())))


def steady(read, what: str, reads: int = 4, step: float = 0.1, timeout: float = 20.0):
    """read()'s value once `reads` reads in a row, `step` seconds apart, agree: what a process
    holds once its start-up is behind it, say."""
    seen = []

    def agree() -> bool:
        seen.append(read())
        return len(seen) >= reads and len(set(seen[-reads:])) == 1
    wait_for(agree, timeout, f"{what} steady over {reads} reads (last: {seen[-reads:]})", step)
    return seen[-1]


def percpu_kthreads(cpu: int) -> List[int]:
    """Kernel threads bound to exactly `cpu` (ksoftirqd/N, migration/N, ...)."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as handle:
                data = handle.read()
            fields = data[data.rindex(")") + 2:].split()
            if not int(fields[6]) & 0x00200000:
                continue
            if os.sched_getaffinity(int(name)) == {cpu}:
                out.append(int(name))
        except (OSError, ValueError):
            continue
    return out


needs_two_cpus = pytest.mark.skipif(len(online_cpus()) < 2 or not {0, 1} <= os.sched_getaffinity(0),
                                    reason="needs CPUs 0 and 1 online and allowed")
