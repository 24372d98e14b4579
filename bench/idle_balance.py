"""Idle-priority borrowers on every CPU, and fair threads that queue behind each other.

The background tier (and a yield group at the idle policy) runs at idle priority: SCHED_IDLE,
and temperd's cpu.idle cgroup, so a waking fair thread preempts it at once. What it still takes:
a CPU that runs only such work is not idle to the scheduler, so when its fair thread blocks it
picks the borrower instead of pulling a fair thread that waits on another CPU's runqueue (the
kernel's newidle balance runs only on a CPU with no runnable task of the fair class, and
SCHED_IDLE is of that class). Where every CPU has a borrower, a fair thread queued behind
another waits for it to block or for the next periodic balance.

Workers: --workers processes at nice 0, each looping --work-us of CPU then --sleep-us of sleep
(together more than one CPU and less than all, so that they sometimes queue behind each other).
Variants, interleaved and reversed every other repetition, each for --seconds:
- none: no borrower;
- every CPU: one SCHED_IDLE spinner pinned to each CPU;
- all but CPU 0: one SCHED_IDLE spinner pinned to each CPU except CPU 0.
Per block: the workers' runqueue wait (schedstat) summed, as % of one CPU, and each sleep's
lateness (woken past its due time) p50 and p99 over all workers.

    .venv/bin/python bench/idle_balance.py [--seconds 4] [--reps 3] [--workers 3]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import time
from typing import Dict, List, Sequence, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import HostMonitor, host_description  # noqa: E402

from temperd.sources import procfs  # noqa: E402
from temperd.training import harness as T  # noqa: E402

Block = Tuple[float, float, float, int]  # wait % of a CPU, lateness p50 us, p99 us, cycles


def worker(results, seconds: float, work_s: float, sleep_s: float) -> None:
    end = time.monotonic() + seconds
    late: List[float] = []
    me = os.getpid()  # one thread: its tid is the pid
    wait0 = procfs.read_schedstat(me, me).wait_ns
    while time.monotonic() < end:
        began = time.monotonic()
        while time.monotonic() - began < work_s:
            pass
        due = time.monotonic() + sleep_s
        time.sleep(sleep_s)
        late.append(time.monotonic() - due)
    results.put((procfs.read_schedstat(me, me).wait_ns - wait0, late))


def spinner(cpu: int, end: float) -> None:
    os.sched_setaffinity(0, {cpu})
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    while time.monotonic() < end:
        pass


def block(borrower_cpus: Sequence[int], args) -> Block:
    end = time.monotonic() + args.seconds + 2.0  # outlives the workers; bounded if this script dies
    spinners = [multiprocessing.Process(target=spinner, args=(cpu, end)) for cpu in borrower_cpus]
    for proc in spinners:
        proc.start()
    T.wait_until(lambda: all(procfs.read_thread_stat(p.pid) and os.sched_getscheduler(p.pid) == os.SCHED_IDLE
                             for p in spinners), 5.0)
    results = multiprocessing.Queue()
    workers = [multiprocessing.Process(target=worker, args=(results, args.seconds, args.work_us / 1e6,
                                                             args.sleep_us / 1e6)) for _ in range(args.workers)]
    for proc in workers:
        proc.start()
    got = [results.get(timeout=args.seconds + 30) for _ in workers]
    for proc in workers + spinners:
        proc.terminate()
        proc.join()
    late = sorted(x for _, lateness in got for x in lateness)
    cuts = statistics.quantiles(late, n=100)
    return 100.0 * sum(w for w, _ in got) / 1e9 / args.seconds, cuts[49] * 1e6, cuts[98] * 1e6, len(late)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=4.0, help="length of each block (default 4)")
    parser.add_argument("--reps", type=int, default=3, help="repetitions of each variant (default 3)")
    parser.add_argument("--workers", type=int, default=3, help="fair worker processes (default 3)")
    parser.add_argument("--work-us", type=float, default=500, help="each worker's CPU per cycle (default 500)")
    parser.add_argument("--sleep-us", type=float, default=500, help="each worker's sleep per cycle (default 500)")
    args = parser.parse_args(argv)
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit("idle_balance: needs two CPUs or more")
    variants: Dict[str, Tuple[int, ...]] = {"none": (), "every CPU": tuple(cpus), "all but CPU 0": tuple(cpus[1:])}
    print(host_description())
    monitor = HostMonitor()
    monitor.start()
    time.sleep(1.0)
    print(f"before: {monitor.stop().describe()}")
    print(f"{args.workers} workers, {args.work_us:g} us work + {args.sleep_us:g} us sleep per cycle, "
          f"{args.seconds:g} s blocks, {args.reps} repetitions")
    out: Dict[str, List[Block]] = {name: [] for name in variants}
    for rep in range(args.reps):
        for name in T.arm_order(list(variants), rep):
            monitor = HostMonitor()
            monitor.start()
            result = block(variants[name], args)
            window = monitor.stop()
            out[name].append(result)
            print(f"rep {rep} {name:<14} wait {result[0]:5.1f} % of a CPU, lateness p50 {result[1]:5.0f} "
                  f"p99 {result[2]:5.0f} us, {result[3]} cycles; {window.describe()}", flush=True)
    print()
    print(f"{'idle-priority spinners on':<26} {'workers wait, % of a CPU':>26} {'lateness p99, us':>22} "
          f"{'cycles':>8}")
    for name, blocks in out.items():
        wait, p99 = T.spread(b[0] for b in blocks), T.spread(b[2] for b in blocks)
        print(f"{name:<26} {wait.median:8.1f} ({wait.low:5.1f}-{wait.high:5.1f})       "
              f"{p99.median:8.0f} ({p99.low:5.0f}-{p99.high:5.0f}) {statistics.median(b[3] for b in blocks):8.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
