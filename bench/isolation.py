"""Isolation: a latency-sensitive server from a Debian package under its standard load generator
while CPU spinners crowd the host, with the stock scheduler and with temperd's native backend.

Usage (root, from the checkout):
  .venv/bin/python bench/isolation.py                  # redis, about 6-8 minutes
  .venv/bin/python bench/isolation.py --quick          # smoke run: 1 repetition, bg 0 and 4
  .venv/bin/python bench/isolation.py --server memcached
  options: --reps N --ladder 0,1,2,4 --clients 50,1 --arms stock,temperd,temperd+bg --seconds S
           --no-pmqos --json FILE

What runs:
- redis-server (Debian's, via tests/servers.py) on 127.0.0.1, 100 000 keys of 64 bytes, loaded
  by `redis-benchmark -t get -r 100000 -c C -n N --csv` (rps, p50, p99 from its CSV); C = 50
  (saturated) and C = 1 (single client). N is sized once at the start so a stock run at bg = 0
  takes about --seconds; every arm of a step gets the same N. memcached (--server memcached):
  `memcaslap -T 1 -c C -t S` (its default 90 % get / 10 % set); memcaslap gives only a log2
  histogram, so its p50/p99 are bucket upper bounds (coarse: a factor of 2).
- Background: `stress-ng --cpu BG --cpu-method int64`, time-bounded, for BG in the ladder.
- Sessions (autogroup is on: the scheduler first shares CPU between sessions, then between the
  threads of one session): the server runs in its own session, as a service manager starts a
  service; the load generator and the spinners run in this script's session, so they share one
  autogroup, as a batch job started beside a benchmark shell would.
- cgroups: the server is moved into a cgroup v2 directory of its own (`<cgroup2 root>/temperd-
  bench-PID-server`) and the spinners start in another (`...-spinners`), in every arm. No
  controller is enabled there: the directories only name the processes for bindings. A cgroup
  binding is what a unit binding resolves to on a systemd host, and the only way to give the
  critical tier without systemd (TEMPER_WORKLOAD_PROFILE in the environment picks a profile but
  leaves the default tier, and would need the server started with it).
- Arms, interleaved within every step and alternating which goes first per repetition, so this
  noisy host's drift hits all of them:
    stock          temperd not running;
    temperd        `[[binding]] cgroup = "/temperd-bench-PID-server" tier = "critical"
                   profile = "redis" cpus = 1.0`: the builtin profile, event loop on an exclusive core;
    temperd+bg     the same plus `[[binding]] cgroup = "/temperd-bench-PID-spinners"
                   tier = "background"`: the spinners yield (SCHED_IDLE);
    temperd+pmqos, temperd+bg+pmqos  (single client, bg 0 and 1) those arms with a file profile
                   overriding the builtin with `idle_resume_us = 0` on the exclusive group: the
                   native backend writes pm_qos_resume_latency_us = "n/a" (0 us: polling idle
                   only, the one value that changes anything under the haltpoll governor) on
                   that CPU.
    scx, scx+bg    (opt-in, --arms) temperd and temperd+bg with `backend = "scx"`: the same plan
                   carried by scx_layered (sched_ext; on PATH, e.g. /usr/bin/scx_layered) instead
                   of affinities and policies. A run starts once scx_layered has attached and
                   temperd reads its stats; what scx_layered reported about each layer over the
                   run (its stats socket, one connection: deltas over the run) is kept per run.
  temperd starts before the spinners and stops after them, so every run starts from a restored
  host; stock runs check that affinities and PM QoS values were put back (and that sched_ext is
  disabled again after an scx arm).
- Where the load generator runs: on this 2-CPU host it is a local process competing for CPU.
  Under stock it floats over both CPUs; under temperd the server's exclusive group owns CPU 1 and
  every other thread -- the load generator and the spinners included -- is kept on CPU 0, where
  the load generator competes with the spinners of its own session. The table's `client` column
  shows where it really ran (its last CPU, sampled every 50 ms) and its affinity; `cwait%` is
  its runqueue wait (schedstat) as a share of the run, `swait%` the server threads' runqueue
  wait: together they tell whether a tail comes from the server or from the load generator.
- Per run: the host's idle and steal share (from /proc/stat deltas) and the CPU used by user-space
  processes outside this benchmark (foreign, % of one core). A run with foreign > --noisy-foreign
  or steal > --noisy-steal is repeated once (at most --max-retries in all); a run still noisy is
  kept and counted in the `noisy` column.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import common as C  # bench/common.py; also puts the checkout and tests/ on sys.path

import servers as S  # noqa: E402  (tests/servers.py: real servers on loopback)
from temperd.backends.native.sched import POLICY_NAMES  # noqa: E402
from temperd.plan import CONFINED  # noqa: E402

STOCK, TEMPERD, TEMPERD_BG = "stock", "temperd", "temperd+bg"
PMQOS, PMQOS_BG = "temperd+pmqos", "temperd+bg+pmqos"
SCX, SCX_BG = "scx", "scx+bg"  # the temperd arms with backend = "scx" (scx_layered)
ARMS = (STOCK, TEMPERD, TEMPERD_BG)
SCX_ARMS = (SCX, SCX_BG)
BG_ARMS = (TEMPERD_BG, PMQOS_BG, SCX_BG)  # the spinners' cgroup bound to the background tier
SCX_STATE = "/sys/kernel/sched_ext/state"
SCX_STATS_SOCKET = "/var/run/scx/root/stats"
SCX_ATTACH_S = 180.0  # scx_layered's BPF load and attach (about 30 s under software emulation)
PMQOS_OF = {TEMPERD: PMQOS, TEMPERD_BG: PMQOS_BG}  # the same arm with idle_resume_us = 0
PMQOS_FILE = "/sys/devices/system/cpu/cpu{cpu}/power/pm_qos_resume_latency_us"


# ---- the server and its load generator ------------------------------------------------------------


@dataclass(frozen=True)
class Measurement:
    rps: float
    p50_ms: float
    p99_ms: float


class Target:
    """A server, how to load it and how to read the load generator's answer."""

    name = ""
    profile_id = ""
    exclusive_group = ""  # the profile's exclusive thread group (where idle_resume_us goes)
    tool = ""

    def server(self):
        raise NotImplementedError

    def prepare(self, server) -> None:
        pass

    def size(self, server, clients: int, seconds: float, timeout_s: float) -> int:
        """The amount of work for a run of about `seconds` (stock, bg = 0)."""
        return max(1, int(round(seconds)))

    def argv(self, server, clients: int, amount: int) -> List[str]:
        raise NotImplementedError

    def parse(self, stdout: str) -> Measurement:
        raise NotImplementedError


class RedisTarget(Target):
    name = "redis"
    profile_id = "redis"
    exclusive_group = "event-loop"
    tool = "redis-benchmark"
    keys = 100000

    def server(self):
        return S.redis_server()

    def prepare(self, server) -> None:
        # 100 000 keys as redis-benchmark -r names them (key:%012d), 64-byte values, one pipe.
        value = "v" * 64
        lines = []
        for i in range(self.keys):
            key = f"key:{i:012d}"
            lines.append(f"*3\r\n$3\r\nSET\r\n${len(key)}\r\n{key}\r\n${len(value)}\r\n{value}\r\n")
        cli = S.require("redis-cli", "redis-tools")
        out = subprocess.run([cli, "-h", S.LOOPBACK, "-p", str(server.port), "--pipe"], input="".join(lines),
                             capture_output=True, text=True, timeout=60)
        if out.returncode != 0 or "errors: 0" not in out.stdout:
            raise SystemExit(f"could not load the keys into redis: {(out.stdout + out.stderr).strip()[-300:]}")
        size = S.redis_cli(server, "DBSIZE")
        if int(size) != self.keys:
            raise SystemExit(f"redis has {size} keys after loading, expected {self.keys}")

    def size(self, server, clients: int, seconds: float, timeout_s: float) -> int:
        probe = 50000 if clients > 1 else 10000
        out = subprocess.run(self.argv(server, clients, probe), capture_output=True, text=True, timeout=timeout_s)
        rps = self.parse(out.stdout).rps
        return max(5000, int(round(rps * seconds, -3)))

    def argv(self, server, clients: int, amount: int) -> List[str]:
        return ["redis-benchmark", "-h", S.LOOPBACK, "-p", str(server.port), "-t", "get", "-r", str(self.keys),
                "-c", str(clients), "-n", str(amount), "--csv"]

    def parse(self, stdout: str) -> Measurement:
        import csv
        import io

        rows = [r for r in csv.DictReader(io.StringIO(stdout)) if r.get("test") == "GET"]
        if not rows:
            raise ValueError(f"no GET row in redis-benchmark output: {stdout.strip()[-300:]!r}")
        row = rows[-1]
        return Measurement(float(row["rps"]), float(row["p50_latency_ms"]), float(row["p99_latency_ms"]))


class MemcachedTarget(Target):
    name = "memcached"
    profile_id = "memcached"
    exclusive_group = "workers"
    tool = "memcaslap"

    def server(self):
        return S.memcached_server()

    def argv(self, server, clients: int, amount: int) -> List[str]:
        return ["memcaslap", "-s", f"{S.LOOPBACK}:{server.port}", "-T", "1", "-c", str(clients),
                "-t", f"{amount}s", "-S", f"{amount}s"]

    def parse(self, stdout: str) -> Measurement:
        total = re.search(r"Run time: [\d.]+s Ops: \d+ TPS: (\d+)", stdout)
        section = stdout.split("Get Statistics (", 1)
        if not total or len(section) < 2:
            raise ValueError(f"unexpected memcaslap output: {stdout.strip()[-300:]!r}")
        dist = section[1].split("Log2 Dist:", 1)[1].split("\n\n", 1)[0]
        buckets: Dict[int, int] = {}
        for line in dist.strip().splitlines():
            head, _, counts = line.partition(":")
            base = int(head)
            for offset, count in enumerate(counts.split()):
                buckets[base + offset] = int(count)
        return Measurement(float(total.group(1)), _log2_quantile(buckets, 0.50), _log2_quantile(buckets, 0.99))


def _log2_quantile(buckets: Dict[int, int], q: float) -> float:
    """Upper bound (ms) of the log2 microsecond bucket holding the q-quantile."""
    total = sum(buckets.values())
    seen = 0
    for exp in sorted(buckets):
        seen += buckets[exp]
        if total and seen >= q * total:
            return 2.0 ** (exp + 1) / 1000.0
    return float("nan")


TARGETS: Dict[str, Callable[[], Target]] = {"redis": RedisTarget, "memcached": MemcachedTarget}


# ---- spinners, cgroup, placement ------------------------------------------------------------------------


@contextlib.contextmanager
def spinners(count: int, limit_s: float, cgroup: str) -> Iterator[List[int]]:
    """stress-ng --cpu COUNT in this session (own process group, for cleanup) and in `cgroup`;
    yields the worker pids."""
    if count == 0:
        yield []
        return
    procs = os.path.join(C.CGROUP2_ROOT, cgroup.lstrip("/"), "cgroup.procs")

    def join() -> None:  # in the child, before exec: same session, own process group, own cgroup
        os.setpgrp()
        with open(procs, "w") as handle:
            handle.write("0")

    proc = subprocess.Popen(["stress-ng", "--cpu", str(count), "--cpu-method", "int64", "--timeout", f"{int(limit_s)}s",
                             "--quiet"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            stdin=subprocess.DEVNULL, preexec_fn=join)
    try:
        workers = C.wait_until(lambda: _workers(proc.pid, count), 5.0, 0.02) or []
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


def _workers(parent: int, count: int) -> Optional[List[int]]:
    kids = S.child_pids(parent)
    return kids if len(kids) >= count else None


@contextlib.contextmanager
def own_cgroup(suffix: str, pid: Optional[int] = None) -> Iterator[str]:
    """A fresh cgroup v2 directory (and `pid` moved into it); yields its path relative to the cgroup2 root.
    No controller is enabled in it: it only names the processes for a [[binding]]."""
    name = f"temperd-bench-{os.getpid()}-{suffix}"
    path = os.path.join(C.CGROUP2_ROOT, name)
    os.makedirs(path, exist_ok=True)
    try:
        if pid is not None:
            with open(os.path.join(path, "cgroup.procs"), "w") as handle:
                handle.write(str(pid))
        yield "/" + name
    finally:
        # The server has stopped (or is moved back) before the directory can go.
        with contextlib.suppress(OSError):
            with open(os.path.join(path, "cgroup.procs")) as handle:
                left = handle.read().split()
            for other in left:
                with open(os.path.join(C.CGROUP2_ROOT, "cgroup.procs"), "w") as handle:
                    handle.write(other)
        with contextlib.suppress(OSError):
            os.rmdir(path)


class PlacementSampler:
    """Where a process last ran, sampled: CPU -> share of samples."""

    def __init__(self):
        self.counts: Dict[str, Dict[int, int]] = {}

    def sample(self, label: str, pid: int) -> None:
        stat = C.read_stat(pid)
        if stat is not None:
            table = self.counts.setdefault(label, {})
            table[stat.processor] = table.get(stat.processor, 0) + 1

    def describe(self, label: str) -> str:
        table = self.counts.get(label) or {}
        total = sum(table.values())
        if not total:
            return "-"
        return " ".join(f"{cpu}:{100 * n // total}%" for cpu, n in sorted(table.items()))


class ScxStats:
    """scx_layered's stats socket on one connection of our own: each reply holds the deltas since
    the previous request on it, so a request before the run and one after give the run's stats."""

    def __init__(self, path: str = SCX_STATS_SOCKET, timeout_s: float = 10.0):
        import socket

        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.settimeout(timeout_s)
        self.sock.connect(path)
        self.reader = self.sock.makefile("r")

    def read(self) -> dict:
        self.sock.sendall(b'{"req":"stats","args":{"target":"top"}}\n')
        reply = json.loads(self.reader.readline())
        if reply.get("errno"):
            raise RuntimeError(f"scx_layered stats: errno {reply['errno']}")
        return reply["args"]["resp"]

    def close(self) -> None:
        self.reader.close()
        self.sock.close()


def scx_summary(stats: dict) -> Dict[str, dict]:
    """What scx_layered said about each layer over a run: tasks, CPUs it held, CPU use (100 = one
    CPU), the share of it on protected CPUs, and its own affinity violations; "" = the whole system."""
    out = {"": {k: stats.get(k) for k in ("busy", "util", "affn_viol", "lo_fb", "antistall")}}
    for name, layer in (stats.get("layers") or {}).items():
        out[name] = {k: layer.get(k) for k in ("tasks", "cur_nr_cpus", "util", "util_protected_frac", "affn_viol")}
        out[name]["cpus"] = C.cpulist({64 * i + b for i, w in enumerate(layer.get("cpus") or []) for b in range(64) if w >> b & 1})
    return out


def _scx_state() -> str:
    return C.read_text(SCX_STATE, "-")


# ---- one run ------------------------------------------------------------------------------------------------


@dataclass
class Run:
    server: str
    clients: int
    bg: int
    arm: str
    rep: int
    amount: int
    rps: float = float("nan")
    p50_ms: float = float("nan")
    p99_ms: float = float("nan")
    seconds: float = 0.0
    idle_pct: float = 0.0
    steal_pct: float = 0.0
    foreign_core_pct: float = 0.0
    foreign_top: str = ""
    noisy: bool = False
    retried: bool = False
    client_cpus: str = "-"  # where the load generator last ran (sampled)
    client_allowed: str = "-"  # its affinity while running
    client_wait_pct: float = float("nan")  # runqueue wait of the load generator, % of its run's wall time
    server_wait_pct: float = float("nan")  # runqueue wait of the server's threads, % of wall time
    server_cpus: str = "-"
    spinners_allowed: str = "-"
    spinners_policy: str = "-"
    exclusive_cpus: str = "-"
    pmqos: str = "-"  # pm_qos_resume_latency_us of the exclusive CPU during the run
    scx: Dict[str, dict] = field(default_factory=dict)  # scx arms: scx_summary() over the run
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error


@dataclass
class Settings:
    target: Target
    amounts: Dict[int, int]
    timeout_s: float
    noisy_foreign: float
    noisy_steal: float
    server_cgroup: str = ""
    spinner_cgroup: str = ""
    pmqos_originals: Dict[int, str] = field(default_factory=dict)
    settle_s: float = 0.5


def pmqos_profile(target: Target, resume_us: int) -> str:
    """The builtin profile with idle_resume_us on its exclusive group (a file profile overrides the builtin)."""
    with open(os.path.join(C.ROOT, "profiles", f"{target.profile_id}.toml")) as handle:
        text = handle.read()
    marker = f'name = "{target.exclusive_group}"\n'
    if marker not in text:
        raise SystemExit(f"profiles/{target.profile_id}.toml has no thread group {target.exclusive_group!r}")
    return text.replace(marker, marker + f"idle_resume_us = {resume_us}\n", 1)


@contextlib.contextmanager
def arm_context(arm: str, settings: Settings, server) -> Iterator[Tuple[frozenset, Optional[C.TemperdProcess]]]:
    """Yields (exclusive CPUs, daemon) with the arm in force; stock yields (empty, None)."""
    if arm == STOCK:
        yield frozenset(), None
        return
    target = settings.target
    binding = (f'[[binding]]\ncgroup = "{settings.server_cgroup}"\ntier = "critical"\nprofile = "{target.profile_id}"\n'
               f'cpus = 1.0\n')
    if arm in BG_ARMS:
        binding += f'[[binding]]\ncgroup = "{settings.spinner_cgroup}"\ntier = "background"\n'
    profiles = {f"{target.profile_id}.toml": pmqos_profile(target, 0)} if arm in (PMQOS, PMQOS_BG) else {}
    backend = "scx" if arm in SCX_ARMS else "native"
    with C.running_temperd(bindings=binding, profiles=profiles, backend=backend) as daemon:
        status = daemon.status()
        if status["profiles"]["failed"]:
            raise RuntimeError(f"temperd did not load a profile: {status['profiles']['failed']}")
        exclusive = frozenset(c for layer in status["layers"] if layer["kind"] == CONFINED for c in layer["cpus"])
        if not exclusive:
            raise RuntimeError(f"temperd made no exclusive layer for {target.name}: {status['workloads']}")
        if backend == "scx":
            # scx_layered places the threads itself (affinities stay as they were): wait until it
            # carries the plan and temperd has read its stats.
            def attached():
                backend_status = daemon.status()["backend"]
                supervisor = backend_status.get("scx_layered") or {}
                return (backend_status.get("carried_by") == "scx" and supervisor.get("state") == "running"
                        and supervisor.get("stats_reads", 0) > 0), backend_status

            ok, last = attached()
            deadline = time.monotonic() + SCX_ATTACH_S
            while not ok and time.monotonic() < deadline and last.get("carried_by") != "native":
                time.sleep(1.0)
                ok, last = attached()
            if not ok:
                raise RuntimeError(f"scx_layered does not carry the plan (sched_ext {_scx_state()}): "
                                   f"backend {last.get('active')}, {last.get('reason') or last.get('safe_mode_reason')}")
        else:
            main_ok = C.wait_until(lambda: C.affinity_of(server.pid) == exclusive, 10.0)
            if not main_ok:
                raise RuntimeError(f"{target.name}'s main thread is not on CPUs {C.cpulist(exclusive)} after 10 s")
        yield exclusive, daemon


def run_once(settings: Settings, server, clients: int, bg: int, arm: str, rep: int) -> Run:
    target = settings.target
    run = Run(target.name, clients, bg, arm, rep, settings.amounts[clients])
    online = frozenset(int(c) for c in _online_cpus())
    if arm == STOCK:
        # Every arm must start from a restored host: our own affinity (inherited by the load
        # generator and the spinners) and the server's.
        for who, pid in (("this benchmark", os.getpid()), (target.name, server.pid)):
            found = C.affinity_of(pid)
            if found != online:
                run.error = f"{who} has affinity {C.cpulist(found or ())} before a stock run: temperd did not restore it"
                return run
        for cpu, original in settings.pmqos_originals.items():
            found = C.read_text(PMQOS_FILE.format(cpu=cpu), "?")
            if found != original:
                run.error = f"CPU {cpu} pm_qos_resume_latency_us is {found!r}, was {original!r}: not restored"
                return run
        if os.path.exists(SCX_STATE) and not C.wait_until(lambda: _scx_state() == "disabled", 20.0):
            run.error = f"sched_ext is {_scx_state()} before a stock run: scx_layered did not exit"
            return run
    try:
        with arm_context(arm, settings, server) as (exclusive, daemon):
            run.exclusive_cpus = C.cpulist(exclusive) if exclusive else "-"
            if exclusive:
                run.pmqos = "/".join(C.read_text(PMQOS_FILE.format(cpu=c), "?") for c in sorted(exclusive))
            with spinners(bg, settings.timeout_s + 30, settings.spinner_cgroup) as workers:
                if arm in SCX_ARMS:  # scx_layered keeps the spinners off the exclusive core, not affinities
                    time.sleep(settings.settle_s)
                    stats = ScxStats()
                    try:
                        stats.read()
                        _measure(settings, server, run, clients)
                        run.scx = scx_summary(stats.read())
                    finally:
                        stats.close()
                    return run
                if exclusive and workers:
                    kept_off = C.wait_until(lambda: all(not ((C.affinity_of(w) or exclusive) & exclusive)
                                                        for w in workers), 5.0)
                    if not kept_off:
                        run.error = "spinners were not kept off the exclusive CPU within 5 s"
                        return run
                if arm in BG_ARMS and workers:
                    idle = C.wait_until(lambda: all(_policy(w) == os.SCHED_IDLE for w in workers), 5.0)
                    if not idle:
                        run.error = "background-tier spinners did not get SCHED_IDLE within 5 s"
                        return run
                if workers:
                    run.spinners_allowed = C.cpulist(C.affinity_of(workers[0]) or ())
                    run.spinners_policy = POLICY_NAMES.get(_policy(workers[0]), "?")
                time.sleep(settings.settle_s)
                _measure(settings, server, run, clients)
    except (RuntimeError, subprocess.SubprocessError, OSError) as exc:
        run.error = str(exc)
    return run


def _measure(settings: Settings, server, run: Run, clients: int) -> None:
    target = settings.target
    sampler = PlacementSampler()
    monitor = C.HostMonitor()
    monitor.start()
    proc = subprocess.Popen(target.argv(server, clients, run.amount), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True)
    started = time.monotonic()
    deadline = started + settings.timeout_s
    allowed = set()
    server0 = C.schedstat_totals(server.pid)
    client_wait = (0, 0.0)  # (wait ns, seconds since start) at the last sample
    try:
        while proc.poll() is None:
            if time.monotonic() >= deadline:
                proc.kill()
                proc.wait()
                run.error = f"{target.tool} did not finish within {settings.timeout_s:.0f} s"
                return
            sampler.sample("client", proc.pid)
            sampler.sample("server", server.pid)
            found = C.affinity_of(proc.pid)
            if found:
                allowed.add(C.cpulist(found))
            waited = C.schedstat_totals(proc.pid)[1]
            if waited:
                client_wait = (waited, time.monotonic() - started)
            time.sleep(0.05)
        stdout = proc.stdout.read()
    finally:
        window = monitor.stop()
        server1 = C.schedstat_totals(server.pid)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    run.seconds = window.seconds
    run.idle_pct, run.steal_pct = window.idle_pct, window.steal_pct
    run.foreign_core_pct, run.foreign_top = window.foreign_core_pct, window.foreign_top
    run.noisy = window.noisy(settings.noisy_foreign, settings.noisy_steal)
    run.client_cpus, run.server_cpus = sampler.describe("client"), sampler.describe("server")
    run.client_allowed = "/".join(sorted(allowed)) or "-"
    if client_wait[1] > 0:
        run.client_wait_pct = 100.0 * client_wait[0] / 1e9 / client_wait[1]
    run.server_wait_pct = 100.0 * (server1[1] - server0[1]) / 1e9 / max(window.seconds, 1e-6)
    if proc.returncode != 0:
        run.error = f"{target.tool} exited with {proc.returncode}: {stdout.strip()[-200:]}"
        return
    try:
        m = target.parse(stdout)
    except ValueError as exc:
        run.error = str(exc)
        return
    run.rps, run.p50_ms, run.p99_ms = m.rps, m.p50_ms, m.p99_ms


def _policy(pid: int) -> Optional[int]:
    try:
        return os.sched_getscheduler(pid)
    except OSError:
        return None


def _online_cpus() -> List[str]:
    from temperd.backends.native import sched

    return [str(c) for c in sorted(sched.online_cpus())]


# ---- the whole benchmark ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    clients: int
    bg: int
    arms: Tuple[str, ...]


def build_steps(clients: Sequence[int], ladder: Sequence[int], pmqos_bgs: Sequence[int],
                base_arms: Sequence[str] = ARMS) -> List[Step]:
    steps = []
    for c in clients:
        for bg in ladder:
            extra = tuple(PMQOS_OF[a] for a in base_arms if a in PMQOS_OF) if c == 1 and bg in pmqos_bgs else ()
            arms = tuple(base_arms) + extra
            steps.append(Step(c, bg, arms))
    return steps


@dataclass
class Summary:
    rps: float
    p50_ms: float
    p99_ms: float
    runs: int
    noisy: int
    idle_pct: float
    steal_pct: float
    foreign_core_pct: float
    client_cpus: str
    client_allowed: str
    client_wait_pct: float
    server_wait_pct: float
    server_cpus: str
    errors: List[str] = field(default_factory=list)


def summarise(runs: Sequence[Run]) -> Dict[Tuple[int, int, str], Summary]:
    groups: Dict[Tuple[int, int, str], List[Run]] = {}
    for run in runs:
        groups.setdefault((run.clients, run.bg, run.arm), []).append(run)
    out = {}
    for key, group in groups.items():
        good = [r for r in group if r.ok]
        last = good[-1] if good else group[-1]
        out[key] = Summary(
            C.median([r.rps for r in good]), C.median([r.p50_ms for r in good]), C.median([r.p99_ms for r in good]),
            len(good), sum(1 for r in good if r.noisy), C.median([r.idle_pct for r in good]),
            C.median([r.steal_pct for r in good]), C.median([r.foreign_core_pct for r in good]),
            last.client_cpus, last.client_allowed, C.median([r.client_wait_pct for r in good]),
            C.median([r.server_wait_pct for r in good]), last.server_cpus, [r.error for r in group if r.error])
    return out


def ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def print_table(target: Target, clients: int, steps: Sequence[Step], summary, amounts) -> None:
    print()
    print(f"{target.name}, {target.tool} {clients} client(s), {amounts[clients]} "
          f"{'requests' if target.name == 'redis' else 's'} per run; medians over the runs")
    head = (f"{'bg':>3} {'arm':<16} {'rps':>9} {'p50 ms':>7} {'p99 ms':>7} {'rps/st':>7} {'p99/st':>7} "
            f"{'cwait%':>6} {'swait%':>6} {'runs':>4} {'noisy':>5} {'idle%':>5} {'steal%':>6} {'frgn%':>5}  "
            f"client ran on (allowed); server ran on")
    print(head)
    print("-" * len(head))
    for step in steps:
        if step.clients != clients:
            continue
        stock = summary.get((clients, step.bg, STOCK))
        for arm in step.arms:
            s = summary.get((clients, step.bg, arm))
            if s is None:
                continue
            rr = ratio(s.rps, stock.rps) if stock else float("nan")
            pr = ratio(s.p99_ms, stock.p99_ms) if stock else float("nan")
            print(f"{step.bg:>3} {arm:<16} {s.rps:9.0f} {s.p50_ms:7.3f} {s.p99_ms:7.3f} {rr:7.2f} {pr:7.2f} "
                  f"{s.client_wait_pct:6.1f} {s.server_wait_pct:6.1f} "
                  f"{s.runs:>4} {s.noisy:>5} {s.idle_pct:5.1f} {s.steal_pct:6.1f} {s.foreign_core_pct:5.1f}  "
                  f"{s.client_cpus} ({s.client_allowed}); {s.server_cpus}")
            for error in s.errors:
                print(f"      error: {error}")


def goals(clients: int, ladder: Sequence[int], summary, arm: str = TEMPERD) -> List[Tuple[str, Optional[bool], str]]:
    """The issue's goals for one client count and arm: (text, verdict or None when not measurable, numbers)."""
    out: List[Tuple[str, Optional[bool], str]] = []
    tmp = {bg: summary.get((clients, bg, arm)) for bg in ladder}
    stock = {bg: summary.get((clients, bg, STOCK)) for bg in ladder}
    top = max(ladder)
    have = [bg for bg in ladder if tmp[bg] is not None and tmp[bg].runs]
    if top in have:
        best_bg = min(have, key=lambda bg: tmp[bg].p99_ms)
        best = tmp[best_bg].p99_ms
        value = tmp[top].p99_ms
        out.append((f"{arm} p99 at bg={top} within 1.25x of its best step", value <= 1.25 * best,
                    f"{value:.3f} ms vs best {best:.3f} ms at bg={best_bg}: {ratio(value, best):.2f}x"))
    else:
        out.append((f"{arm} p99 at bg={top} within 1.25x of its best step", None, "not measured"))
    if top in have and stock[top] is not None and stock[top].runs:
        gain = ratio(stock[top].p99_ms, tmp[top].p99_ms)
        out.append((f"{arm} p99 at bg={top} at least 3x better than stock", gain >= 3.0,
                    f"stock {stock[top].p99_ms:.3f} ms / {arm} {tmp[top].p99_ms:.3f} ms = {gain:.2f}x"))
    else:
        out.append((f"{arm} p99 at bg={top} at least 3x better than stock", None, "not measured"))
    if 0 in have and stock.get(0) is not None and stock[0].runs:
        share = ratio(tmp[0].rps, stock[0].rps)
        out.append(("throughput at bg=0 at least 0.98x stock", share >= 0.98,
                    f"{tmp[0].rps:.0f} / {stock[0].rps:.0f} rps = {share:.3f}x"))
    else:
        out.append(("throughput at bg=0 at least 0.98x stock", None, "bg=0 not measured"))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", choices=sorted(TARGETS), default="redis")
    parser.add_argument("--reps", type=int, default=3, help="repetitions per step (default 3)")
    parser.add_argument("--ladder", default="0,1,2,4", help="spinner counts (default 0,1,2,4)")
    parser.add_argument("--clients", default="50,1", help="client counts (default 50,1)")
    parser.add_argument("--seconds", type=float, default=2.5, help="length of a stock bg=0 run (default 2.5)")
    parser.add_argument("--arms", default=",".join(ARMS),
                        help=f"arms (default {','.join(ARMS)}): temperd = the server's critical-tier binding; "
                             "temperd+bg = that plus the spinners' cgroup bound to the background tier; "
                             "scx, scx+bg = those with backend = \"scx\" (needs sched_ext and scx_layered)")
    parser.add_argument("--pmqos-ladder", default="0,1", help="single-client steps with the idle_resume_us = 0 arm")
    parser.add_argument("--no-pmqos", action="store_true", help="leave out the temperd+pmqos arm")
    parser.add_argument("--quick", action="store_true", help="smoke run: 1 repetition, bg 0 and 4, PM QoS at bg 0")
    parser.add_argument("--noisy-foreign", type=float, default=10.0, help="%% of a core used by other processes that marks a run noisy")
    parser.add_argument("--noisy-steal", type=float, default=5.0, help="steal %% that marks a run noisy")
    parser.add_argument("--max-retries", type=int, default=8, help="noisy runs repeated, in all (default 8)")
    parser.add_argument("--max-minutes", type=float, default=20.0, help="stop starting runs after this long")
    parser.add_argument("--json", metavar="FILE", help="write every run as JSON")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("isolation.py: must run as root (temperd changes scheduling settings of other processes)", file=sys.stderr)
        return 2
    if args.quick:
        args.reps, args.ladder, args.pmqos_ladder, args.seconds = 1, "0,4", "0", min(args.seconds, 1.5)
    ladder = [int(x) for x in args.ladder.split(",")]
    clients = [int(x) for x in args.clients.split(",")]
    pmqos_bgs = [] if args.no_pmqos else [int(x) for x in args.pmqos_ladder.split(",") if x != ""]
    for tool in ("stress-ng",):
        S.require(tool, tool)
    target = TARGETS[args.server]()
    arms = [a for a in args.arms.split(",") if a]
    unknown = [a for a in arms if a not in ARMS + SCX_ARMS]
    if unknown or STOCK not in arms:
        parser.error(f"--arms: expected stock plus any of {', '.join(ARMS[1:] + SCX_ARMS)}, found {args.arms!r}")
    steps = build_steps(clients, ladder, pmqos_bgs, arms)
    started = time.monotonic()
    print(C.host_description())
    print(f"started {time.strftime('%Y-%m-%d %H:%M:%S %Z')}, load average {C.load_average():.2f}")
    quiet = C.wait_for_quiet(60.0, foreign_limit_pct=args.noisy_foreign)
    print(f"host before the run: idle {quiet.idle_pct:.0f} %, steal {quiet.steal_pct:.1f} %, other processes "
          f"{quiet.foreign_core_pct:.1f} % of a core {('(' + quiet.foreign_top + ')') if quiet.foreign_top else ''}")
    runs: List[Run] = []
    retries = 0
    try:
        with target.server() as server, own_cgroup("server", server.pid) as cgroup, \
                own_cgroup("spinners") as spinner_cgroup:
            target.prepare(server)
            timeout_s = max(60.0, 12 * args.seconds)
            amounts = {c: target.size(server, c, args.seconds, timeout_s) for c in clients}
            originals = {int(c): C.read_text(PMQOS_FILE.format(cpu=c), "?") for c in _online_cpus()}
            settings = Settings(target, amounts, timeout_s, args.noisy_foreign, args.noisy_steal,
                                cgroup, spinner_cgroup, originals)
            print(f"{target.name} {server.version.split()[2] if target.name == 'redis' else server.version} "
                  f"pid {server.pid} in cgroup {cgroup}, spinners in {spinner_cgroup}; work per run: "
                  + ", ".join(f"c={c}: {a}" for c, a in amounts.items()))
            planned = sum(len(s.arms) for s in steps) * args.reps
            print(f"{planned} runs: {len(steps)} steps x {args.reps} repetitions, arms interleaved; "
                  f"client and spinners in this session (autogroup), server in its own")
            done = 0
            for rep in range(args.reps):
                for step in steps:
                    arms = step.arms if rep % 2 == 0 else tuple(reversed(step.arms))
                    for arm in arms:
                        if time.monotonic() - started > args.max_minutes * 60:
                            print(f"stopping: --max-minutes {args.max_minutes:g} reached", flush=True)
                            raise _OutOfTime()
                        run = run_once(settings, server, step.clients, step.bg, arm, rep)
                        if run.ok and run.noisy and retries < args.max_retries:
                            retries += 1
                            again = run_once(settings, server, step.clients, step.bg, arm, rep)
                            again.retried = True
                            run = again if again.ok else run
                        runs.append(run)
                        done += 1
                        _progress(done, planned, run, started)
    except _OutOfTime:
        pass
    except KeyboardInterrupt:
        print("interrupted: results so far", flush=True)
    except S.ServerUnavailable as exc:
        print(f"isolation.py: {exc}", file=sys.stderr)
        return 2
    if not runs:
        print("no runs completed", file=sys.stderr)
        return 1
    summary = summarise(runs)
    for c in clients:
        print_table(target, c, steps, summary, settings.amounts)
    _print_pmqos(clients, pmqos_bgs, summary)
    _print_scx(runs)
    print()
    print("Where the load generator ran: a local process on this host. Under stock it floats over all CPUs;")
    print("under temperd the server's exclusive group owns its CPU and every other thread, the load generator and")
    print("the spinners included, is kept off it (the `client` column: last CPU, sampled every 50 ms).")
    print("cwait% / swait%: runqueue wait (schedstat) of the load generator / the server's threads, % of the run.")
    verdicts = []
    for c in clients:
        label = "saturated" if c > 1 else "single client"
        for arm in arms[1:]:
            print(f"\nGoals, {c} client(s) ({label}), arm {arm}:")
            for text, ok, numbers in goals(c, ladder, summary, arm):
                verdict = "n/a " if ok is None else ("PASS" if ok else "MISS")
                verdicts.append(ok)
                print(f"  {verdict}  {text}: {numbers}")
    print(f"\n{len(runs)} runs in {(time.monotonic() - started) / 60:.1f} min, {retries} repeated as noisy; "
          f"finished {time.strftime('%H:%M:%S')}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"host": C.host_description(), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                       "amounts": settings.amounts, "runs": [asdict(r) for r in runs]}, handle, indent=1)
    return 0


class _OutOfTime(Exception):
    pass


def _progress(done: int, planned: int, run: Run, started: float) -> None:
    what = (f"rps {run.rps:8.0f} p50 {run.p50_ms:6.3f} p99 {run.p99_ms:6.3f} ms, idle {run.idle_pct:4.1f} % "
            f"steal {run.steal_pct:3.1f} % foreign {run.foreign_core_pct:4.1f} %"
            + (" NOISY" if run.noisy else "") + (" (repeated)" if run.retried else "")) if run.ok else f"ERROR {run.error}"
    print(f"[{done:>3}/{planned} {time.monotonic() - started:5.0f}s] c={run.clients:<2} bg={run.bg} {run.arm:<13} {what}",
          flush=True)


def _print_pmqos(clients: Sequence[int], pmqos_bgs: Sequence[int], summary) -> None:
    if 1 not in clients:
        return
    rows = []
    for bg in pmqos_bgs:
        stock = summary.get((1, bg, STOCK))
        for base, bound in PMQOS_OF.items():
            plain, with_bound = summary.get((1, bg, base)), summary.get((1, bg, bound))
            if plain is not None and with_bound is not None:
                rows.append((bg, base, plain, with_bound, stock))
    if not rows:
        return
    print("\nIdle-resume bound: idle_resume_us = 0 on the exclusive group (pm_qos_resume_latency_us 'n/a' on its CPU),"
          " 1 client, medians:")
    print(f"{'bg':>3} {'arm':<11} {'p99 ms':>7} {'+bound':>7} {'ratio':>6} {'rps':>7} {'+bound':>7} {'ratio':>6} "
          f"{'stock p99':>9} {'stock rps':>9}")
    for bg, base, plain, bound, stock in rows:
        print(f"{bg:>3} {base:<11} {plain.p99_ms:7.3f} {bound.p99_ms:7.3f} {ratio(bound.p99_ms, plain.p99_ms):6.2f} "
              f"{plain.rps:7.0f} {bound.rps:7.0f} {ratio(bound.rps, plain.rps):6.2f} "
              f"{stock.p99_ms if stock else float('nan'):9.3f} {stock.rps if stock else float('nan'):9.0f}")


def _print_scx(runs: Sequence[Run]) -> None:
    """What scx_layered reported about each layer over the scx arms' runs (medians)."""
    groups: Dict[Tuple[int, int, str], List[Run]] = {}
    for run in runs:
        if run.scx:
            groups.setdefault((run.clients, run.bg, run.arm), []).append(run)
    if not groups:
        return
    print("\nWhat scx_layered reported over each run (its stats socket: deltas over the run), medians; "
          "util: % of one CPU; prot: share of util on the layer's protected CPUs:")
    print(f"{'c':>3} {'bg':>3} {'arm':<7} {'layer':<44} {'tasks':>5} {'cpus':>4} {'util%':>6} {'prot':>5} "
          f"{'affn_viol':>9}  cpu mask")
    for (clients, bg, arm), group in sorted(groups.items()):
        system = [r.scx.get("", {}) for r in group]
        print(f"{clients:>3} {bg:>3} {arm:<7} {'(system: busy % of all CPUs / util)':<44} {'':>5} {'':>4} "
              f"{_med(system, 'util'):6.0f} {'':>5} {_med(system, 'affn_viol'):9.0f}  busy {_med(system, 'busy'):.0f} %")
        names = sorted({n for r in group for n in r.scx if n})
        for name in names:
            rows = [r.scx[name] for r in group if name in r.scx]
            print(f"{'':>3} {'':>3} {'':<7} {name[:44]:<44} {_med(rows, 'tasks'):5.0f} {_med(rows, 'cur_nr_cpus'):4.0f} "
                  f"{_med(rows, 'util'):6.1f} {_med(rows, 'util_protected_frac'):5.2f} {_med(rows, 'affn_viol'):9.0f}  "
                  f"{rows[-1].get('cpus', '-')}")


def _med(rows: Sequence[dict], key: str) -> float:
    return C.median([float(r[key]) for r in rows if isinstance(r.get(key), (int, float))])


if __name__ == "__main__":
    sys.exit(main())
