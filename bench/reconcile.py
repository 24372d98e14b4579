"""CPU cost of one full inventory reconcile with many extra threads alive, and event latency.

Usage: python bench/reconcile.py [--threads 2000] [--runs 15] [--renames 300]

A child process holds the extra threads (named with PR_SET_NAME) so the measuring process stays
small. Reconcile cost is CPU time of the calling thread (user + system) for one scan of /proc:
"cold" is the first scan (every process read whole), "warm" is the steady state the daemon's
periodic reconcile pays. The latency part renames a thread in a child process at a steady rate
and measures from just before prctl(PR_SET_NAME) to the rename being in the inventory.
"""

from __future__ import annotations

import argparse
import os
import select
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from temperd.sources.changes import RENAME  # noqa: E402
from temperd.sources.inventory import Inventory  # noqa: E402
from temperd.sources.shape import online_cpus  # noqa: E402

HOLDER = r"""
import ctypes, sys, threading
libc = ctypes.CDLL(None, use_errno=True)
n = int(sys.argv[1])
threading.stack_size(256 * 1024)
stop = threading.Event()
def worker(i):
    libc.prctl(15, ("bench-%d" % i).encode(), 0, 0, 0)
    stop.wait()
threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(n)]
for t in threads:
    t.start()
print("ready", flush=True)
sys.stdin.read()
"""

RENAMER = r"""
import ctypes, sys, time
libc = ctypes.CDLL(None, use_errno=True)
count, interval = int(sys.argv[1]), float(sys.argv[2])
sys.stdin.readline()
stamps = []
for i in range(count):
    name = ("rn%d" % i).encode()
    stamps.append(time.monotonic_ns())
    libc.prctl(15, name, 0, 0, 0)
    time.sleep(interval)
print(" ".join(map(str, stamps)), flush=True)
"""


def percentile(values, q):
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, int(round(q / 100.0 * (len(ordered) - 1)))))
    return ordered[index]


def measure_reconcile(extra_threads: int, runs: int, extra_processes: int = 0):
    """extra_processes of the extra threads are single-threaded processes (sleep), the rest
    threads of one process: per-process facts (exe, cmdline, cgroup) cost more than a thread."""
    sleepers = [subprocess.Popen(["sleep", "600"]) for _ in range(extra_processes)]
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(max(0, extra_threads - extra_processes))],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        if holder.stdout.readline().strip() != "ready":
            raise SystemExit("thread holder did not start")
        cold_cpu, cold_wall, warm_cpu, warm_wall = [], [], [], []
        total_threads = 0
        for _ in range(runs):
            inventory = Inventory()
            summary = inventory.reconcile()
            cold_cpu.append(summary.cpu_s)
            cold_wall.append(summary.duration_s)
            summary = inventory.reconcile()
            warm_cpu.append(summary.cpu_s)
            warm_wall.append(summary.duration_s)
            total_threads = summary.threads
            processes = summary.processes
        return total_threads, processes, cold_cpu, cold_wall, warm_cpu, warm_wall
    finally:
        holder.stdin.close()
        holder.wait(timeout=10)
        for sleeper in sleepers:
            sleeper.kill()
            sleeper.wait()


def measure_latency(renames: int, interval_s: float):
    inventory = Inventory()
    if not inventory.start():
        print(f"latency: skipped, process events unavailable ({inventory.unavailable_reason})")
        return None
    seen = {}

    def on_changes(changes):
        now = time.monotonic_ns()
        for change in changes:
            if change.kind == RENAME and change.comm and change.comm.startswith("rn"):
                seen.setdefault(change.comm, now)

    inventory.subscribe(on_changes)
    renamer = subprocess.Popen([sys.executable, "-c", RENAMER, str(renames), str(interval_s)],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        cpu0 = time.process_time()
        renamer.stdin.write("go\n")
        renamer.stdin.flush()
        deadline = time.monotonic() + renames * interval_s * 3 + 10
        while renamer.poll() is None and time.monotonic() < deadline:
            ready, _, _ = select.select([inventory], [], [], 0.1)
            if ready:
                inventory.handle_events()
        inventory.handle_events()
        cpu = time.process_time() - cpu0
        stamps = [int(x) for x in renamer.stdout.read().split()]
    finally:
        if renamer.poll() is None:
            renamer.kill()
        renamer.wait()
        inventory.close()
    lat_ms = [(seen[f"rn{i}"] - ts) / 1e6 for i, ts in enumerate(stamps) if f"rn{i}" in seen]
    return lat_ms, len(stamps), cpu, inventory.stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2000, help="extra threads held alive")
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--processes", type=int, default=200,
                        help="also measure with this many of the extra threads as separate processes")
    parser.add_argument("--renames", type=int, default=300, help="0 skips the latency part")
    parser.add_argument("--interval-ms", type=float, default=5.0)
    args = parser.parse_args()

    print(f"host: {len(online_cpus())} CPUs, kernel {os.uname().release}")
    scenarios = [(0, 0), (args.threads, 0)]
    if args.processes:
        scenarios.append((args.threads, args.processes))
    for extra, spread in scenarios:
        threads, processes, cold_cpu, cold_wall, warm_cpu, warm_wall = measure_reconcile(extra, args.runs, spread)
        shape = f" ({spread} of them as single-threaded processes)" if spread else ""
        print(f"\nreconcile, {extra} extra threads{shape}: {processes} processes, {threads} threads, "
              f"{args.runs} runs")
        print(f"{'scan':<6} {'cpu median ms':>14} {'cpu p90 ms':>11} {'cpu max ms':>11} {'wall median ms':>15} {'us/thread':>10}")
        for label, cpu, wall in (("cold", cold_cpu, cold_wall), ("warm", warm_cpu, warm_wall)):
            median = statistics.median(cpu)
            print(f"{label:<6} {median * 1e3:>14.1f} {percentile(cpu, 90) * 1e3:>11.1f} {max(cpu) * 1e3:>11.1f} "
                  f"{statistics.median(wall) * 1e3:>15.1f} {median * 1e6 / threads:>10.1f}")

    if args.renames:
        result = measure_latency(args.renames, args.interval_ms / 1e3)
        if result is not None:
            lat_ms, sent, cpu, stats = result
            print(f"\nrename -> inventory ({len(lat_ms)}/{sent} renames seen, one every {args.interval_ms} ms)")
            if lat_ms:
                print(f"{'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'cpu ms/event':>13} {'events':>7} {'lost':>5}")
                print(f"{percentile(lat_ms, 50):>8.3f} {percentile(lat_ms, 99):>8.3f} {max(lat_ms):>8.3f} "
                      f"{cpu * 1e3 / max(1, stats.events_received):>13.3f} {stats.events_received:>7} {stats.events_lost:>5}")


if __name__ == "__main__":
    main()
