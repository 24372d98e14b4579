"""temperd's own CPU use as a share of one core: on an idle host, and with 2 000 extra threads alive.

Usage (root, from the checkout):
  .venv/bin/python bench/overhead.py                 # 60 s per scenario, about 2.5 minutes
  .venv/bin/python bench/overhead.py --seconds 20 --reps 3
  .venv/bin/python bench/overhead.py --profile cprofile   # where the main loop's time goes
  .venv/bin/python bench/overhead.py --reconcile-intervals 30,120   # both scan intervals, one run
  .venv/bin/python bench/overhead.py --tree DIR      # another checkout's temperd, side by side

temperd runs in the foreground with the native backend, the builtin profiles and the default
intervals (reconcile scan every 120 s while process events arrive, unless
--reconcile-intervals says otherwise; observation every 5 s), HTTP /metrics and /observe on a free loopback port (not scraped), its own config
dir, state dir and control socket.

- start-up: utime+stime of the process when its control socket appears, i.e. interpreter start,
  imports, config and profile load, the first /proc scan (reconcile), plan and apply. The first
  reconcile's own CPU (from `temperctl status`) is shown beside it.
- steady: utime+stime of the whole process (all threads, exited ones included) from
  /proc/PID/stat over --seconds, after --settle seconds; clock ticks are 10 ms, so a 60 s window
  resolves 0.017 % of a core. The live threads' schedstat run time (ns) is shown as a finer check.
- +2000 threads: a helper process (bench/reconcile.py's holder) keeps 2 000 named sleeping
  threads alive from before temperd starts until it stops.

- in the window: tasks created on the host (/proc/loadavg's last pid), process events temperd
  received, plans applied and full scans, so that an expensive window says what temperd did in
  it; and the scheduling-delay source (/observe's latency: bpf, or schedstat and why).
- --churn RATE: a further scenario with RATE short-lived foreign processes forked per second (a
  busy host's cron jobs, health checks, test runs): temperd's cost per process event.
- --learner on|off|both: classification and rightsizing ([classify], [rightsizing]; on by
  default) kept on, switched off, or both as arms of one run. With --track, the +N threads holder
  runs in a cgroup of its own bound in temperd.toml, so it is a workload temperd tracks (samples
  every second, classifies, keeps a usage history for); the daemon's RSS at the end of the window
  and the size of the history file it saved are printed, and the learner's thread's own CPU over the
  window (temperctl status' learner): its cost apart from whatever else the host makes temperd do.
- --bpf on|off|both: the bcc telemetry (bpf/runqlat.bpf.c) where it loads, kept off
  (TEMPERD_BPF=0), or both as arms of one run. In a TCG-emulated VM only the ratio of the two
  means anything; absolute figures there are not a host's.
- --switch-load PAIRS: a further scenario with a context-switch load: PAIRS pairs of processes
  bouncing a byte over pipes as fast as they can, whose threads are members of a layer (a file
  profile treats them: the bcc program's whole path, histogram included, runs on each of their
  wakeups and switches), and PAIRS pairs that match nothing (the program's cost for a non-member:
  a bit test). The program runs in the context of whatever switches, so its cost lands on the
  load, not on temperd: the round trips per second of each kind, bpf on against off, are that
  cost. --threads 0 leaves out the +threads scenario.

Goal: <= 0.13 % of one core, for the median and for the worst window.

--profile cprofile runs temperd under cProfile (bench-only wrapper: the daemon's main thread,
which does every periodic job) and prints the functions by cumulative time with calls per second;
--profile py-spy PATH samples every thread with py-spy (PATH = the py-spy binary).
Profiling inflates the CPU numbers; use it to see where the time goes, not how much.
"""

from __future__ import annotations

import argparse
import json
import os
import pstats
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from typing import List, Optional, Sequence

import common as C  # bench/common.py; also puts the checkout and tests/ on sys.path

from reconcile import HOLDER  # noqa: E402  (bench/reconcile.py: 2 000 named sleeping threads)
import servers as S  # noqa: E402

GOAL_PCT = 0.13
# temperctl status is a Python start-up: seconds, but a minute and more in a software-emulated VM
# whose vCPUs the --switch-load keeps busy.
STATUS_TIMEOUT_S = 180.0

# Foreign process churn (--churn RATE): forks RATE short-lived processes a second, as a busy
# host's cron jobs, health checks and test runs do. Each one is a process event temperd receives.
CHURNER = r"""
import os, sys, time
rate = float(sys.argv[1])
period = 1.0 / rate
next_at = time.monotonic()
while True:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    next_at += period
    time.sleep(max(0.0, next_at - time.monotonic()))
"""

# The context-switch load (--switch-load): a pair of processes named NAME bouncing a byte over two
# pipes; the parent counts round trips into an 8-byte file it maps (read by the benchmark).
PINGPONG = r"""
import mmap, os, struct, sys
name, path = sys.argv[1], sys.argv[2]
with open("/proc/self/comm", "w") as handle:
    handle.write(name)
ping_r, ping_w = os.pipe()
pong_r, pong_w = os.pipe()
if os.fork() == 0:
    os.close(ping_w); os.close(pong_r)
    try:
        while os.read(ping_r, 1):
            os.write(pong_w, b"x")
    except BrokenPipeError:  # the parent was stopped first: the pair's end
        pass
    os._exit(0)
os.close(ping_r); os.close(pong_w)
counter = mmap.mmap(os.open(path, os.O_RDWR), 8)
n = 0
while True:
    os.write(ping_w, b"x")
    os.read(pong_r, 1)
    n += 1
    if n & 63 == 0:
        struct.pack_into("Q", counter, 0, n)
"""
MEMBER, OTHER = "pp-member", "pp-other"
# Makes the MEMBER pairs' threads members of a latency layer (the OTHER pairs match nothing).
PINGPONG_PROFILE = f"""schema_version = 1
id = "bench-pingpong"
description = "bench/overhead.py --switch-load: the ping-pong pairs whose threads are layer members"

[fingerprint]
process_names = ["{MEMBER}"]

[[thread_groups]]
name = "pingpong"
catch_all = true
treatment = "latency"
"""


class SwitchLoad:
    """PAIRS member pairs and PAIRS other pairs (--switch-load), started before temperd."""

    def __init__(self, pairs: int):
        self.dir = tempfile.mkdtemp(prefix="overhead-pingpong-")
        self.procs, self.counters = [], {MEMBER: [], OTHER: []}
        for name in (MEMBER, OTHER):
            for i in range(pairs):
                path = os.path.join(self.dir, f"{name}-{i}")
                with open(path, "wb") as handle:
                    handle.write(bytes(8))
                self.counters[name].append(path)
                self.procs.append(subprocess.Popen([sys.executable, "-c", PINGPONG, name, path]))

    def counts(self) -> dict:
        out = {}
        for name, paths in self.counters.items():
            total = 0
            for path in paths:
                with open(path, "rb") as handle:
                    total += int.from_bytes(handle.read(8), "little")
            out[name] = total
        return out

    def stop(self) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait(timeout=20)
        shutil.rmtree(self.dir, ignore_errors=True)


# Runs temperd's click entry point under cProfile and writes the stats when it returns (SIGTERM
# makes the daemon stop, restore and return normally).
CPROFILE_WRAPPER = r"""
import cProfile, sys
from temperd.daemon.main import main
out = sys.argv.pop(1)
profiler = cProfile.Profile()
try:
    profiler.runcall(main, standalone_mode=False)
finally:
    profiler.dump_stats(out)
"""


@dataclass
class Result:
    scenario: str
    threads_on_host: int
    startup_cpu_s: float
    first_reconcile_cpu_s: float
    steady_core_pct: float  # from /proc/PID/stat ticks
    steady_core_pct_ns: float  # from the live threads' schedstat
    window_s: float
    reconciles: int
    observe_sample_cpu_ms: float
    events: int
    # What happened inside the window (the attribution of an expensive one):
    window_events: int = 0  # process events temperd received
    window_replans: int = 0  # plans applied (whole or new threads only)
    window_reconciles: int = 0  # full /proc scans
    window_forks: int = 0  # processes and threads created on the host (from /proc/loadavg's last pid)
    telemetry: str = ""  # the scheduling-delay source (temperctl status' telemetry, or /observe's latency)
    rss_mib: float = 0.0  # the daemon's resident memory at the end of the window
    history_bytes: int = 0  # the rightsizing history file temperd saved when it stopped (0: none)
    usage_core_pct: float = 0.0  # the learner's thread (classification, rightsizing) alone, % of a core
    member_rtps: float = float("nan")  # --switch-load: round trips a second of the member pairs
    other_rtps: float = float("nan")  # and of the pairs that match nothing


def host_threads() -> int:
    total = 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                total += len(os.listdir(f"/proc/{name}/task"))
            except OSError:
                pass
    return total


def last_pid() -> int:
    """The most recently created pid or tid on the host (/proc/loadavg's last field)."""
    with open("/proc/loadavg") as handle:
        return int(handle.read().split()[-1])


def forks_between(first: int, last: int) -> int:
    if last >= first:
        return last - first
    with open("/proc/sys/kernel/pid_max") as handle:  # wrapped around
        return int(handle.read()) - first + last


def telemetry_of(port: int) -> str:
    """The scheduling-delay source, as /observe says it: "bpf" or "schedstat (why)"."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/observe", timeout=10) as reply:
            latency = json.load(reply).get("latency") or {}
    except (OSError, ValueError):
        return "?"
    return latency.get("source", "?") + (f" ({latency['reason']})" if latency.get("reason") else "")


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return 0.0


def usage_cpu(status: dict) -> float:
    """CPU seconds of temperd's learner's thread so far (temperctl status' learner)."""
    return (status.get("learner") or {}).get("sample_cpu_s_total") or 0.0


def own_cgroup(name: str) -> str:
    """A cgroup v2 directory for the holder (under the root on unified hosts, unified/ on hybrid ones)."""
    root = "/sys/fs/cgroup" if os.path.exists("/sys/fs/cgroup/cgroup.controllers") else "/sys/fs/cgroup/unified"
    path = os.path.join(root, name)
    os.makedirs(path, exist_ok=True)
    return path


def measure(scenario: str, seconds: float, settle_s: float, extra_threads: int, command: Optional[Sequence[str]] = None,
            py_spy: Optional[str] = None, py_spy_out: Optional[str] = None,
            reconcile_interval_s: Optional[float] = None, churn: float = 0.0, bpf: str = "on",
            pairs: int = 0, learner: bool = True, track: bool = False) -> Result:
    holder = None
    churner = None
    cgroup_dir = None
    load = SwitchLoad(pairs) if pairs else None
    if extra_threads:
        enter = None
        if track:
            cgroup_dir = own_cgroup(f"temperd-overhead-{os.getpid()}")

            def enter() -> None:
                with open(os.path.join(cgroup_dir, "cgroup.procs"), "w") as handle:
                    handle.write(str(os.getpid()))
        holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(extra_threads)], preexec_fn=enter,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        if holder.stdout.readline().strip() != "ready":
            raise SystemExit("the thread holder did not start")
    if churn:
        churner = subprocess.Popen([sys.executable, "-c", CHURNER, str(churn)])
    try:
        settings = f"reconcile_interval_s = {reconcile_interval_s}\n" if reconcile_interval_s else ""
        history = os.path.join(tempfile.mkdtemp(prefix="overhead-history-"), "usage-history.json")
        settings += (f'[rightsizing]\nhistory_file = "{history}"\n' if learner else
                     "[classify]\nenabled = false\n[rightsizing]\nenabled = false\n")
        bindings = f'[[binding]]\ncgroup = "/{os.path.basename(cgroup_dir)}"\n' if cgroup_dir else ""
        env = {"TEMPERD_BPF": "0" if bpf == "off" else "1"}  # temperd/sources/runqlat.py
        port = S.free_port()
        profiles = {"bench-pingpong.toml": PINGPONG_PROFILE} if load is not None else None
        # bcc compiles the program before temperd serves its socket: seconds, more under emulation.
        with C.running_temperd(http_port=port, command=command, settings=settings, env=env, profiles=profiles,
                               ready_timeout_s=300.0, bindings=bindings) as daemon:
            startup_ticks = daemon.cpu_ticks()
            threads = host_threads()
            status = daemon.status(timeout=STATUS_TIMEOUT_S)
            first_reconcile = status["inventory"]["last_reconcile_cpu_s"]
            time.sleep(settle_s)
            spy = None
            if py_spy:
                spy = C.py_spy_record(daemon.pid, seconds, py_spy_out, py_spy)
            before = daemon.status(timeout=STATUS_TIMEOUT_S)
            if load is not None and not any(l["name"].endswith(".pingpong") and l["members"] >= 2 * pairs
                                            for l in before["layers"]):
                raise SystemExit(f"the {MEMBER} pairs are not members of a layer: {before['layers']}")
            pid0 = last_pid()
            rt0 = load.counts() if load is not None else {}
            ticks0, ns0, t0 = daemon.cpu_ticks(), C.thread_runtime_ns(daemon.pid), time.monotonic()
            time.sleep(seconds)
            ticks1, ns1, t1 = daemon.cpu_ticks(), C.thread_runtime_ns(daemon.pid), time.monotonic()
            rt1 = load.counts() if load is not None else {}
            pid1 = last_pid()
            rss = rss_mib(daemon.pid)
            if spy is not None:
                spy.wait(timeout=seconds + 30)
            status = daemon.status(timeout=STATUS_TIMEOUT_S)
            status["telemetry"] = telemetry_of(port)
    finally:
        if load is not None:
            load.stop()
        if churner is not None:
            churner.kill()
            churner.wait(timeout=20)
        if holder is not None:
            holder.stdin.close()
            holder.wait(timeout=20)
        if cgroup_dir is not None:
            os.rmdir(cgroup_dir)
    wall = t1 - t0
    history_bytes = os.path.getsize(history) if os.path.exists(history) else 0
    overhead = status.get("overhead") or {}
    inventory = status.get("inventory") or {}
    inventory0 = before.get("inventory") or {}
    return Result(scenario, threads, startup_ticks / C.TICK_HZ, first_reconcile,
                  100.0 * (ticks1 - ticks0) / C.TICK_HZ / wall, 100.0 * (ns1 - ns0) / 1e9 / wall, wall,
                  inventory.get("reconciles", 0), 1000.0 * (overhead.get("sample_cpu_s") or 0.0),
                  inventory.get("events_received", 0),
                  inventory.get("events_received", 0) - inventory0.get("events_received", 0),
                  status.get("replans", 0) - before.get("replans", 0),
                  inventory.get("reconciles", 0) - inventory0.get("reconciles", 0),
                  forks_between(pid0, pid1), str(status.get("telemetry") or ""), rss, history_bytes,
                  100.0 * (usage_cpu(status) - usage_cpu(before)) / wall,
                  *((rt1[name] - rt0[name]) / wall if load is not None else float("nan") for name in (MEMBER, OTHER)))


def print_cprofile(path: str, seconds: float, top: int = 25) -> None:
    stats = pstats.Stats(path)
    rows = []
    for (file, line, func), (cc, nc, tt, ct, _) in stats.stats.items():
        rows.append((ct, tt, nc, f"{os.path.relpath(file, C.ROOT) if file.startswith(C.ROOT) else os.path.basename(file)}:{line}({func})"))
    rows.sort(reverse=True)
    print(f"\ncProfile of temperd's main thread (whole run incl. start-up; window {seconds:g} s):")
    print(f"{'cum ms':>9} {'own ms':>8} {'calls':>8} {'ms/call':>8}  function")
    for ct, tt, nc, name in rows[:top]:
        print(f"{ct * 1000:9.1f} {tt * 1000:8.1f} {nc:8d} {ct * 1000 / max(nc, 1):8.3f}  {name}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=60.0, help="measurement window per scenario (default 60)")
    parser.add_argument("--settle", type=float,
                        help="seconds after start-up before the window (default 3; with --track 40: a tracked "
                             "workload is sampled every second until its cgroup has been idle for 30 s)")
    parser.add_argument("--threads", type=int, default=2000, help="extra threads of the second scenario (default 2000)")
    parser.add_argument("--reps", type=int, default=1, help="repetitions per scenario; medians are printed (default 1)")
    parser.add_argument("--reconcile-intervals", default="120",
                        help="comma-separated reconcile_interval_s values, each an arm of the same run (default 120, "
                             "temperd's default), e.g. 30,120")
    parser.add_argument("--churn", type=float, default=0.0,
                        help="also measure with this many short-lived foreign processes forked per second (default: off)")
    parser.add_argument("--bpf", choices=("on", "off", "both"), default="on",
                        help="the bcc telemetry: on (where it loads; else the schedstat fallback), off (TEMPERD_BPF=0), "
                             "or both, each an arm of the same run (its relative cost; in a TCG VM only the ratio means "
                             "anything)")
    parser.add_argument("--learner", choices=("on", "off", "both"), default="on",
                        help="classification and rightsizing: on (temperd's default), off, or both as arms of one run")
    parser.add_argument("--track", action="store_true",
                        help="the +N threads holder is a tracked workload (its own cgroup, bound in temperd.toml)")
    parser.add_argument("--only-churn", action="store_true", help="measure the --churn scenario only")
    parser.add_argument("--switch-load", type=int, default=0, metavar="PAIRS",
                        help="also measure under a context-switch load: PAIRS ping-pong pairs that are layer members "
                             "and PAIRS that are not; their round trips a second are shown (default: off)")
    parser.add_argument("--tree", help="run the temperd package of this checkout (side by side with another)")
    parser.add_argument("--profile", choices=("cprofile", "py-spy"), help="profile temperd while measuring")
    parser.add_argument("--py-spy", dest="py_spy", default=None,
                        help="py-spy binary for --profile py-spy (default: beside this Python, else on PATH)")
    args = parser.parse_args()
    if args.settle is None:
        args.settle = 40.0 if args.track else 3.0
    if os.geteuid() != 0:
        print("overhead.py: must run as root (temperd changes scheduling settings of other processes)", file=sys.stderr)
        return 2
    print(C.host_description())
    print(f"started {time.strftime('%Y-%m-%d %H:%M:%S %Z')}, load average {C.load_average():.2f}")
    quiet = C.wait_for_quiet(60.0)
    print(f"host before the run: idle {quiet.idle_pct:.0f} %, steal {quiet.steal_pct:.1f} %, other processes "
          f"{quiet.foreign_core_pct:.1f} % of a core")
    intervals = [float(v) for v in args.reconcile_intervals.split(",") if v.strip()]
    arms = [("idle host", 0, 0.0, 0)] + ([(f"+{args.threads} threads", args.threads, 0.0, 0)] if args.threads else [])
    if args.churn:
        arms = ([] if args.only_churn else arms) + [(f"+{args.churn:g} forks/s", 0, args.churn, 0)]
    if args.switch_load:
        arms.append((f"+{args.switch_load}+{args.switch_load} ping-pong pairs", 0, 0.0, args.switch_load))
    modes = ("on", "off") if args.bpf == "both" else (args.bpf,)
    scenarios = [(f"{name}, scan {interval:g} s" if len(intervals) > 1 else name, extra, interval, churn, pairs)
                 for interval in intervals for name, extra, churn, pairs in arms]
    if len(modes) > 1:
        scenarios = [(f"{label}, bpf {mode}", extra, interval, churn, pairs)
                     for label, extra, interval, churn, pairs in scenarios for mode in modes]
    if args.track:
        scenarios = [(label.replace(" threads", " threads tracked"), extra, interval, churn, pairs)
                     for label, extra, interval, churn, pairs in scenarios]
    learner_modes = ("on", "off") if args.learner == "both" else (args.learner,)
    if len(learner_modes) > 1:
        scenarios = [(f"{label}, learner {mode}", extra, interval, churn, pairs)
                     for label, extra, interval, churn, pairs in scenarios for mode in learner_modes]
    results: List[Result] = []
    tmp = tempfile.mkdtemp(prefix="overhead-")
    monitors = []
    for rep in range(args.reps):
        for label, extra, interval, churn, pairs in scenarios:
            command: Optional[List[str]] = C.tree_command(args.tree)
            prof = os.path.join(tmp, f"{rep}-{len(results)}.prof")
            if args.profile == "cprofile":
                if args.tree:
                    raise SystemExit("--tree and --profile cprofile: one at a time")
                command = [sys.executable, "-c", CPROFILE_WRAPPER, prof]
            monitor = C.HostMonitor()
            monitor.start()
            result = measure(label, args.seconds, args.settle, extra, command,
                             args.py_spy if args.profile == "py-spy" else None, prof + ".spy", interval, churn,
                             "off" if "bpf off" in label or args.bpf == "off" else "on", pairs,
                             not ("learner off" in label or args.learner == "off"), args.track)
            window = monitor.stop()
            monitors.append(window)
            results.append(result)
            print(f"  {label:<28} start-up {result.startup_cpu_s:.2f} s CPU, steady {result.steady_core_pct:.3f} % "
                  f"of a core ({result.steady_core_pct_ns:.3f} % by schedstat); host idle {window.idle_pct:.0f} %, "
                  f"other processes {window.foreign_core_pct:.1f} % of a core", flush=True)
            print(f"  {'':<28} in the window: {result.window_forks} tasks created on the host, "
                  f"{result.window_events} process events, {result.window_replans} plans applied, "
                  f"{result.window_reconciles} full scans; telemetry {result.telemetry}"
                  + (f"; round trips/s: members {result.member_rtps:.0f}, others {result.other_rtps:.0f}" if pairs else ""),
                  flush=True)
            print(f"  {'':<28} learner's thread (classification, rightsizing) {result.usage_core_pct:.4f} % of a core; "
                  f"daemon RSS {result.rss_mib:.1f} MiB, rightsizing history file {result.history_bytes} bytes",
                  flush=True)
            if args.profile == "cprofile":
                print_cprofile(prof, args.seconds)
            elif args.profile == "py-spy" and os.path.exists(prof + ".spy"):
                C.print_py_spy(prof + ".spy")
    print()
    print(f"temperd CPU ({args.tree or 'this checkout'}), native backend, builtin profiles, HTTP on; {args.seconds:g} s windows, "
          f"{args.reps} repetition(s), medians")
    head = (f"{'scenario':<30} {'threads':>7} {'start-up CPU s':>14} {'1st reconcile ms':>16} "
            f"{'steady % core':>13} {'(schedstat)':>11} {'reconciles':>10} {'observe ms':>10}")
    print(head)
    print("-" * len(head))
    verdicts = []
    for label, _, _, _, _ in scenarios:
        rows = [r for r in results if r.scenario == label]
        steady = C.median([r.steady_core_pct for r in rows])
        verdicts.append((label, steady))
        print(f"{label:<30} {int(C.median([r.threads_on_host for r in rows])):>7} "
              f"{C.median([r.startup_cpu_s for r in rows]):14.2f} "
              f"{1000 * C.median([r.first_reconcile_cpu_s for r in rows]):16.1f} {steady:13.3f} "
              f"{C.median([r.steady_core_pct_ns for r in rows]):11.3f} "
              f"{int(C.median([r.reconciles for r in rows])):>10} {C.median([r.observe_sample_cpu_ms for r in rows]):10.2f}")
    print("(threads: on the host while temperd ran; reconciles: full /proc scans so far incl. the first; "
          "observe ms: CPU of the last observation sample)")
    print()
    for label, steady in verdicts:
        worst = max(r.steady_core_pct for r in results if r.scenario == label)
        ok = steady <= GOAL_PCT and worst <= GOAL_PCT
        print(f"{'PASS' if ok else 'MISS'}  {label}: median {steady:.3f} %, worst window {worst:.3f} % of one core "
              f"(goal <= {GOAL_PCT} % for both)")
    if len(modes) > 1:
        print_bpf_cost(results, [label for label, *_ in scenarios if label.endswith(", bpf on")])
    if args.profile:
        print("\n(profiled: the numbers above include the profiler's own cost)")
    return 0


def print_bpf_cost(results: Sequence[Result], on_labels: Sequence[str]) -> None:
    """bpf on against off, medians of each scenario: temperd's CPU (start-up: the compile) and,
    under --switch-load, the load's round trips a second (where the program's own cost lands)."""
    print("\nbcc telemetry on ÷ off, medians (in a software-emulated VM only these ratios mean anything):")
    print(f"{'scenario':<30} {'start-up CPU s':>16} {'steady % core':>17} {'member rt/s':>19} {'other rt/s':>19}")
    for on_label in on_labels:
        base = on_label[:-len(", bpf on")]
        on = [r for r in results if r.scenario == on_label]
        off = [r for r in results if r.scenario == f"{base}, bpf off"]

        def pair(field: str, fmt: str) -> str:
            a, b = C.median([getattr(r, field) for r in on]), C.median([getattr(r, field) for r in off])
            if a != a or b != b:  # nan: not measured in this scenario
                return "-"
            return f"{a:{fmt}}/{b:{fmt}} {a / b if b else float('nan'):.2f}x"

        print(f"{base:<30} {pair('startup_cpu_s', '.2f'):>16} {pair('steady_core_pct', '.3f'):>17} "
              f"{pair('member_rtps', '.0f'):>19} {pair('other_rtps', '.0f'):>19}")
    print("telemetry in each arm: " + ", ".join(sorted({f"{r.scenario.rsplit(', ', 1)[-1]}: {r.telemetry}" for r in results})))


if __name__ == "__main__":
    sys.exit(main())
