"""How fast temperd.trace.parse reads a captured scheduling trace, and how much memory it needs.

Usage (from the checkout):
  .venv/bin/python bench/trace_parse.py                      # synthetic 1 M events, 5 runs
  .venv/bin/python bench/trace_parse.py --events 2000000 --runs 3
  .venv/bin/python bench/trace_parse.py --capture 10         # root: a real 10 s host capture instead
  .venv/bin/python bench/trace_parse.py --capture 2 --pingpong   # ... while two processes ping-pong

The synthetic trace is what a busy 10 s capture of an 8-CPU host looks like: 400 threads in
20 processes on 8 CPUs; each step one CPU's running thread wakes another (sched_waking, then
sched_wakeup on the target CPU) and is switched out, runnable or asleep; now and then a task
migrates. Lines are written with temperd.trace.format, as a capture writes them. It is parsed
plain and gzip-compressed.

--pingpong runs two processes that bounce a byte through two pipes as fast as they can during
the capture (a wakeup-heavy load, hundreds of thousands of events a second); the capture line
then shows whether the capture kept up (events lost to a full ring buffer).

Reported per input: median wall time over --runs parses, events per second, and memory: the
peak of Python allocations during one extra parse under tracemalloc (what the parser holds;
that run is slower and is not timed) and the process's maximum RSS after all runs. Goal: a
10 s trace of ~1 M events in well under 10 s, memory independent of the number of events
(compare --events 1000000 with --events 2000000).
"""

from __future__ import annotations

import argparse
import gzip
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import tracemalloc
from typing import List, Tuple

import common as C  # noqa: F401  (puts the checkout on sys.path)

from temperd.trace.format import format_line, header
from temperd.trace.parse import parse_trace

GOAL_S = 10.0


def synthesize(path: str, events: int, cpus: int = 8, processes: int = 20, threads_per: int = 20, max_step_us: int = 20,
               seed: int = 7) -> int:
    """Write a plausible trace of about `events` events; returns the number written."""
    rng = random.Random(seed)
    tasks: List[Tuple[int, int, str]] = []  # (tid, tgid, comm)
    for p in range(processes):
        tgid = 2000 + p * 100
        for t in range(threads_per):
            tasks.append((tgid + t, tgid, f"app{p}-w{t}" if t else f"app{p}"))
    running = [None] * cpus  # index into tasks, None = idle
    sleeping = list(range(len(tasks)))
    rng.shuffle(sleeping)
    ts_us = 1_000_000_000  # 1000 s after boot, in microseconds
    written = 0
    with open(path, "w") as out:
        out.write(header({"captured by": "bench/trace_parse.py (synthetic)"}))
        while written < events:
            cpu = rng.randrange(cpus)
            ts_us += rng.randint(1, max_step_us)
            cur = running[cpu]
            comm, tid, tgid = ("swapper/%d" % cpu, 0, 0) if cur is None else (tasks[cur][2], tasks[cur][0], tasks[cur][1])
            lines = []
            if sleeping:
                wakee = sleeping.pop(rng.randrange(len(sleeping)))
                wtid, _, wcomm = tasks[wakee]
                target = rng.randrange(cpus)
                flags = "d.s2" if cur is None else "d..2"
                lines.append(format_line(comm, tid, tgid, cpu, flags, _ts(ts_us), "sched_waking",
                                         f"comm={wcomm} pid={wtid} prio=120 target_cpu={target:03d}"))
                lines.append(format_line(comm, tid, tgid, cpu, "d..3", _ts(ts_us + 1), "sched_wakeup",
                                         f"comm={wcomm} pid={wtid} prio=120 target_cpu={target:03d}"))
                if rng.random() < 0.05:
                    lines.append(format_line(comm, tid, tgid, cpu, "d..2", _ts(ts_us + 1), "sched_migrate_task",
                                             f"comm={wcomm} pid={wtid} prio=120 orig_cpu={target} dest_cpu={cpu}"))
                nxt = wakee
            else:
                nxt = None
            state = "R" if rng.random() < 0.2 else "S"
            ncomm, ntid = ("swapper/%d" % cpu, 0) if nxt is None else (tasks[nxt][2], tasks[nxt][0])
            lines.append(format_line(comm, tid, tgid, cpu, "d..2", _ts(ts_us + 2), "sched_switch",
                                     f"prev_comm={comm} prev_pid={tid} prev_prio=120 prev_state={state} ==> "
                                     f"next_comm={ncomm} next_pid={ntid} next_prio=120"))
            if cur is not None:
                sleeping.append(cur)
            running[cpu] = nxt
            out.write("".join(lines))
            written += len(lines)
    return written


def _ts(us: int) -> str:
    return f"{us // 1_000_000}.{us % 1_000_000:06d}"


PINGPONG = r"""
import os, sys, time
a_r, a_w = os.pipe()
b_r, b_w = os.pipe()
end = time.monotonic() + float(sys.argv[1])
if os.fork() == 0:
    while time.monotonic() < end:
        os.read(a_r, 1)
        os.write(b_w, b"y")
    os._exit(0)
while time.monotonic() < end:
    os.write(a_w, b"x")
    os.read(b_r, 1)
os.write(a_w, b"x")
os.wait()
"""


def capture_real(path: str, seconds: float, pingpong: bool) -> int:
    from temperd.trace.capture import CaptureRequest, capture

    load = subprocess.Popen([sys.executable, "-c", PINGPONG, str(seconds + 1)]) if pingpong else None
    try:
        start = time.perf_counter()
        result = capture(CaptureRequest(output=path, duration_s=seconds, requester="bench/trace_parse.py"))
        wall = time.perf_counter() - start
    finally:
        if load is not None:
            load.wait()
    print(f"capture: {result.events} events in {result.duration_s:.2f} s ({result.events / result.duration_s:,.0f}/s), "
          f"{result.lost_events} lost, stopped by {result.stopped_by}; {wall:.1f} s wall including writing "
          f"{result.text_bytes / 2**20:.1f} MiB")
    if result.compressed:  # a large capture is written gzip; the bench makes its own of each
        with gzip.open(result.output, "rb") as src, open(path, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        os.unlink(result.output)
    return result.events


def measure(path: str, runs: int):
    times = []
    summary = None
    for _ in range(runs):
        start = time.perf_counter()
        summary = parse_trace(path)
        times.append(time.perf_counter() - start)
    tracemalloc.start()
    parse_trace(path)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return summary, times, peak


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=1_000_000, help="synthetic trace size (default 1000000)")
    parser.add_argument("--runs", type=int, default=5, help="timed parses per input; the median is shown (default 5)")
    parser.add_argument("--capture", type=float, metavar="SECONDS", help="parse a real capture of this host instead (root)")
    parser.add_argument("--pingpong", action="store_true", help="with --capture: a wakeup-heavy load during the capture")
    args = parser.parse_args()
    print(C.host_description())
    tmp = tempfile.mkdtemp(prefix="trace-parse-")
    try:
        plain = os.path.join(tmp, "trace.txt")
        start = time.perf_counter()
        if args.capture:
            events = capture_real(plain, args.capture, args.pingpong)
            source = f"real {args.capture:g} s capture of this host" + (" under ping-pong load" if args.pingpong else "")
        else:
            events = synthesize(plain, args.events)
            source = "synthetic (8 CPUs, 400 threads)"
        made_s = time.perf_counter() - start
        packed = plain + ".gz"
        with open(plain, "rb") as src, gzip.open(packed, "wb", compresslevel=6) as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        print(f"input: {source}, {events} events, {os.path.getsize(plain) / 2**20:.1f} MiB text, "
              f"{os.path.getsize(packed) / 2**20:.1f} MiB gzip (made in {made_s:.1f} s)")
        print(f"parse: temperd.trace.parse.parse_trace, {args.runs} runs each, median")
        print()
        head = (f"{'input':<8} {'events':>9} {'median s':>9} {'min s':>7} {'max s':>7} {'events/s':>10} "
                f"{'py peak MiB':>11} {'threads':>7} {'edges':>6}")
        print(head)
        print("-" * len(head))
        worst = 0.0
        for label, path in (("text", plain), ("gzip", packed)):
            summary, times, peak = measure(path, args.runs)
            median = C.median(times)
            worst = max(worst, median)
            print(f"{label:<8} {summary.events:>9} {median:9.2f} {min(times):7.2f} {max(times):7.2f} "
                  f"{summary.events / median:10,.0f} {peak / 2**20:11.2f} {len(summary.threads):>7} {len(summary.edges):>6}")
        maxrss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"(max RSS of this process after all runs: {maxrss_mib:.0f} MiB, interpreter and generator included)")
        print()
        print(f"{'PASS' if worst < GOAL_S else 'MISS'}  slowest median {worst:.2f} s for {events} events (goal < {GOAL_S:g} s)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
