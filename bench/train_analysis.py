"""How fast training analyzes what it observed, and how much memory it needs: parse the trace,
measure each thread, find the request path and the classes, cluster, and write the profile.

Usage (from the checkout):
  .venv/bin/python bench/train_analysis.py                    # synthetic 20 s, ~1 M events, 3 runs
  .venv/bin/python bench/train_analysis.py --events 2000000 --seconds 40

The trace is bench/trace_parse.py's synthetic one (400 threads in 20 processes on 8 CPUs waking
each other at random: a worst case for waker/wakee pairs), stretched to --seconds; every process
is part of the workload, with one /proc sample a second per thread. Reported per stage: the median
wall time over --runs; then the peak of Python allocations during one extra run (tracemalloc) and
the process's maximum RSS. Goal: a 20 s trace of ~1 M events in < 10 s and < 500 MB.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import tempfile
import time
import tracemalloc

import common as C  # noqa: F401  (puts the checkout on sys.path)
from trace_parse import synthesize

from temperd.trace.parse import parse_trace
from temperd.training.analyze import analyze
from temperd.training.features import workload_features
from temperd.training.samples import ProcessInfo, Samples, ThreadSample, ThreadSeries
from temperd.training.synthesize import ShapeFacts, synthesize as synthesize_profile

GOAL_S = 10.0
GOAL_MB = 500.0
SHAPE = ShapeFacts(cores=4, threads_per_core=2, cpus=8, description="8 CPUs (synthetic)")


def samples_for(summary, seconds: int) -> Samples:
    """One /proc sample a second for every thread the trace names, all of them the workload's."""
    samples = Samples(root_pid=2000, unit=None, interval_s=1.0, duration_s=float(seconds))
    for tid, stats in summary.threads.items():
        pid = stats.tgid if stats.tgid else tid
        if pid not in samples.processes:
            samples.processes[pid] = ProcessInfo(pid, 1, f"app{(pid - 2000) // 100}", "/usr/bin/app",
                                                 [f"app --shard {pid}"], None, None, None)
        series = ThreadSeries(tid, pid, stats.comm)
        for second in range(seconds + 1):
            share = second / max(1, seconds)
            series.samples.append(ThreadSample(float(second), "S", int(stats.runtime_ns * share),
                                               int(stats.wait_ns * share)))
        samples.threads[tid] = series
    return samples


def one_run(path: str, seconds: int) -> dict:
    times = {}
    start = time.perf_counter()
    summary = parse_trace(path)
    times["parse"] = time.perf_counter() - start
    samples = samples_for(summary, seconds)
    start = time.perf_counter()
    features = workload_features(summary, samples)
    times["features"] = time.perf_counter() - start
    start = time.perf_counter()
    analysis = analyze(features, 8.0, "synthetic", {p: list(i.titles) for p, i in samples.processes.items()})
    times["analyze"] = time.perf_counter() - start
    start = time.perf_counter()
    root = samples.processes[min(samples.processes)]
    synthesize_profile(analysis, root, SHAPE, load="synthetic")
    times["synthesize"] = time.perf_counter() - start
    times["total"] = sum(times.values())
    times["_events"] = summary.events
    times["_threads"] = len(features.threads)
    times["_groups"] = len(analysis.clusters)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--seconds", type=int, default=20, help="how long the synthetic trace spans")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="train-bench-") as tmp:
        path = os.path.join(tmp, "trace.txt")
        # bench/trace_parse.py's generator: ~2.5 events a step, steps of 1..max_step_us
        written = synthesize(path, args.events, max_step_us=max(2, int(2 * args.seconds * 1e6 / (args.events / 2.5))))
        runs = [one_run(path, args.seconds) for _ in range(args.runs)]
        tracemalloc.start()
        one_run(path, args.seconds)
        peak_mb = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
        size_mb = os.path.getsize(path) / 2**20
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"train analysis: {written} events written ({size_mb:.0f} MiB text) spanning ~{args.seconds} s, "
          f"{runs[0]['_threads']} threads -> {runs[0]['_groups']} groups; median of {args.runs} runs")
    print()
    print(f"{'stage':<12} {'median s':>9} {'min s':>7} {'max s':>7}")
    print("-" * 38)
    for stage in ("parse", "features", "analyze", "synthesize", "total"):
        values = [r[stage] for r in runs]
        print(f"{stage:<12} {statistics.median(values):>9.2f} {min(values):>7.2f} {max(values):>7.2f}")
    print()
    print(f"Python peak (tracemalloc, one run): {peak_mb:.1f} MiB; max RSS of this process: {rss_mb:.0f} MiB")
    total = statistics.median(r["total"] for r in runs)
    ok = total < GOAL_S and rss_mb < GOAL_MB
    print(f"{'OK  ' if ok else 'MISS'} {total:.2f} s for {runs[0]['_events']} events (goal < {GOAL_S:g} s), "
          f"{rss_mb:.0f} MiB RSS (goal < {GOAL_MB:g} MB)")


if __name__ == "__main__":
    main()
