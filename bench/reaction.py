"""Reaction time: a thread renamed (pthread_setname_np / PR_SET_NAME) -> matched to its new group.

Usage: python bench/reaction.py [--renames 400] [--interval-ms 5] [--threads 2000]

A child process creates threads and renames them at a steady rate, alternating between names of
two thread groups of a profile. The measuring side runs what the daemon runs on each event
batch: inventory update, the matcher over every process, the planner. Latency is from just
before the rename in the child (CLOCK_MONOTONIC, shared by both processes) to the moment the
match shows the thread in its new group. CPU is the measuring thread's CPU time per rename.
The second table is one full reconcile scan at N extra threads (bench/reconcile.py).
"""

from __future__ import annotations

import argparse
import os
import select
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)

from reconcile import measure_reconcile, percentile  # noqa: E402

from temperd.config.daemon_config import DaemonConfig  # noqa: E402
from temperd.sources.inventory import Inventory  # noqa: E402
from temperd.decide.matcher import Matcher  # noqa: E402
from temperd.decide.planner import plan  # noqa: E402
from temperd.config.profile import parse_profile  # noqa: E402
from temperd.sources.shape import read_shape  # noqa: E402

PROFILE = parse_profile("""
schema_version = 1
id = "bench"
[fingerprint]
process_names = ["bench-react"]
[[thread_groups]]
name = "workers"
thread_names = ["wrk-*"]
treatment = "exclusive"
[[thread_groups]]
name = "io"
thread_names = ["io-*"]
treatment = "latency"
[[thread_groups]]
name = "rest"
catch_all = true
treatment = "yield"
""", "bench.toml")

RENAMER = r"""
import ctypes, sys, threading, time
libc = ctypes.CDLL(None, use_errno=True)
libc.pthread_setname_np.argtypes = [ctypes.c_ulong, ctypes.c_char_p]
count, interval, nthreads = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
libc.prctl(15, b"bench-react", 0, 0, 0)
stop = threading.Event()
threads = [threading.Thread(target=stop.wait, daemon=True) for _ in range(nthreads)]
for t in threads:
    t.start()
print("ready", flush=True)
sys.stdin.readline()
stamps = []
for i in range(count):
    t = threads[i % nthreads]
    name = ("wrk-%d" if i % 2 else "io-%d") % i
    stamps.append("%d %s %d" % (t.native_id, name, time.monotonic_ns()))
    libc.pthread_setname_np(t.ident, name.encode())
    time.sleep(interval)
print(";".join(stamps), flush=True)
"""


def measure_reaction(renames: int, interval_s: float, nthreads: int = 8):
    inventory = Inventory()
    if not inventory.start():
        raise SystemExit(f"process events unavailable: {inventory.unavailable_reason}")
    shape = read_shape()
    matcher = Matcher(DaemonConfig(), {"bench": PROFILE})
    child = subprocess.Popen([sys.executable, "-c", RENAMER, str(renames), str(interval_s), str(nthreads)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        inventory.reconcile()
        matcher.match(inventory.processes.values())
        seen = {}  # (tid, name) -> monotonic ns when matched to the right group
        cpu_before = time.thread_time()
        child.stdin.write("go\n")
        child.stdin.flush()
        deadline = time.monotonic() + renames * interval_s + 10
        while child.poll() is None and time.monotonic() < deadline:
            ready, _, _ = select.select([inventory, child.stdout], [], [], 0.5)
            if inventory in ready:
                if inventory.handle_events():
                    result = matcher.match(inventory.processes.values())
                    plan(shape, result.workloads, {"bench": PROFILE})
                    now = time.monotonic_ns()
                    for workload in result.workloads:
                        for thread in workload.threads:
                            if thread.group in ("workers", "io"):
                                seen.setdefault((thread.tid, thread.comm), now)
            if child.stdout in ready:
                break
        cpu = time.thread_time() - cpu_before
        stamps_line = child.stdout.readline().strip()
        child.wait(timeout=10)
    finally:
        if child.poll() is None:
            child.kill()
        inventory.close()
    latencies = []
    missed = 0
    for entry in stamps_line.split(";"):
        tid, name, stamp = entry.split()
        matched = seen.get((int(tid), name))
        if matched is None:
            missed += 1
        else:
            latencies.append((matched - int(stamp)) / 1e6)
    return latencies, missed, cpu / max(1, renames)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--renames", type=int, default=400)
    parser.add_argument("--interval-ms", type=float, default=5.0)
    parser.add_argument("--threads", type=int, default=2000, help="extra threads for the reconcile measurement")
    parser.add_argument("--runs", type=int, default=9, help="reconcile runs")
    args = parser.parse_args()

    latencies, missed, cpu_per = measure_reaction(args.renames, args.interval_ms / 1e3)
    print(f"rename -> matched to its group ({args.renames} renames, one every {args.interval_ms:g} ms)")
    print(f"{'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'missed':>7} {'CPU/rename ms':>14}")
    print(f"{percentile(latencies, 50):8.3f} {percentile(latencies, 99):8.3f} {max(latencies):8.3f} "
          f"{missed:7d} {cpu_per * 1e3:14.3f}")
    print("target: p99 < 5 ms")
    print()
    threads, processes, cold_cpu, _, warm_cpu, _ = measure_reconcile(args.threads, args.runs)
    print(f"full reconcile scan: {threads} threads in {processes} processes ({args.runs} runs)")
    print(f"{'scan':<6} {'median CPU ms':>14} {'p90 CPU ms':>11}")
    for label, cpu in (("first", cold_cpu), ("warm", warm_cpu)):
        print(f"{label:<6} {statistics.median(cpu) * 1e3:14.1f} {percentile(cpu, 90) * 1e3:11.1f}")
    print("target: < 50 ms CPU at 2000 threads")


if __name__ == "__main__":
    main()
