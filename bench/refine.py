"""One `temperctl train evaluate --refine` run, end to end, as an operator would do it: a server
from its Debian package, temperd running (builtin profiles, its own config and socket), a profile
trained on the server (or given), then the evaluation (the profile bound against temperd's own
treatment, --background N spinners in the background tier) and the hill climb from it; prints the
verdict and every trial, and keeps the refined profile with its trial log.

Usage (root, from the checkout):
  .venv/bin/python bench/refine.py                        # redis c=50, train 20 s, 6 trials, bg 4
  options: --server redis|jvm --profile FILE (instead of training) --train S --max-trials N
           --background N --reps N --seconds S --out FILE (default: in a new temperd-refine-* directory
           under $TMPDIR, with the trained profile)

The metric is the load generator's p99 (lower is better); each arm runs --reps times per trial,
interleaved; a change is kept only when temperd.training.evaluate's rule calls it better (ranges
apart, medians >= 5 % apart).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time

import arms as A  # bench/arms.py
import common as C  # bench/common.py; also puts the checkout and tests/ on sys.path
import workloads as W  # bench/workloads.py

from temperd.training import harness as T  # noqa: E402

# The p99 column of each workload's load generator output, as `--metric` takes it.
P99_METRIC = {
    "redis": r'^"GET","[^"]*","[^"]*","[^"]*","[^"]*","[^"]*","([0-9.]+)"',  # redis-benchmark --csv
    "jvm": r"p99_ms ([0-9.]+)",  # tests/jvm/http_load.py
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", choices=sorted(P99_METRIC), default="redis")
    parser.add_argument("--profile", metavar="FILE", help="the profile to refine (default: train one)")
    parser.add_argument("--train", type=float, default=20.0, metavar="S", help="training length (default 20 s)")
    parser.add_argument("--max-trials", type=int, default=6)
    parser.add_argument("--background", type=int, default=4, help="spinners beside each run (default 4)")
    parser.add_argument("--reps", type=int, default=5, help="runs per arm and trial (default 5)")
    parser.add_argument("--seconds", type=float, default=3.0, help="length of one benchmark run (default 3 s)")
    parser.add_argument("--out", metavar="FILE", help="the refined profile (default: beside the trained one)")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("refine.py: must run as root (temperd changes scheduling settings of other processes)", file=sys.stderr)
        return 2
    workload = W.WORKLOADS[args.server]()
    variant = workload.variants[0]
    workdir = tempfile.mkdtemp(prefix=f"temperd-refine-{workload.name}-")  # kept: the profiles and the log
    out_path = args.out or os.path.join(workdir, f"{workload.name}-refined.toml")
    print(C.host_description())
    print(f"started {time.strftime('%Y-%m-%d %H:%M:%S %Z')}; host before: {T.wait_for_quiet(60.0).describe()}")
    started = time.monotonic()
    with workload.server() as server:
        workload.prepare(server)
        timeout_s = max(60.0, 12 * args.seconds)
        profile = args.profile or os.path.join(workdir, f"{workload.name}-trained.toml")
        if not args.profile:
            A.train_profile(workload, server, variant, args.train, profile, timeout_s)
        amount = workload.size(server, variant, args.seconds, timeout_s)
        bench = shlex.join(workload.load_argv(server, variant, amount))
        print(f"bench: {bench}\nmetric: p99, lower is better: {P99_METRIC[workload.name]}")
        with C.running_temperd() as daemon:
            argv = [os.path.join(C.BINDIR, "temperctl"), "train", "evaluate", profile, "--pid", str(server.pid),
                    "--bench", bench, "--metric", P99_METRIC[workload.name], "--background", str(args.background),
                    "--reps", str(args.reps), "--tier", "critical", "--refine", "--max-trials", str(args.max_trials),
                    "-o", out_path, "--socket", daemon.socket, "--json"]
            done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        print(f"temperctl train evaluate failed ({done.returncode}): {done.stderr.strip()[-800:]}", file=sys.stderr)
        return 1
    result = json.loads(done.stdout)
    print(f"\nprofile {profile} against temperd's own treatment (builtin profiles), bg={args.background}: "
          f"{result['with']['median']:g} ms vs {result['without']['median']:g} ms p99, {result['ratio']:.3f}x, "
          f"{result['verdict']}\nrule: {result['rule']}\n")
    for trial in result["trials"]:
        print(f"trial {trial['trial']}: {trial['change']}: {trial['candidate']['median']:g} ms "
              f"({trial['candidate']['low']:g}..{trial['candidate']['high']:g}) vs best {trial['best']['median']:g} ms "
              f"({trial['best']['low']:g}..{trial['best']['high']:g}), {trial['ratio']:.3f}x, {trial['verdict']}, "
              + ("kept" if trial["kept"] else "dropped"))
    noisy = sum(1 for r in result["runs"] if r["noisy"])
    print(f"\nrefined profile: {out_path} ({sum(t['kept'] for t in result['trials'])} of {len(result['trials'])} kept); "
          f"{len(result['runs'])} evaluation runs, {noisy} noisy; {(time.monotonic() - started) / 60:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
