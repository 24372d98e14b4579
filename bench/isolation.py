"""Isolation: redis-server (Debian package) under redis-benchmark with a CPU-spinner ladder,
stock scheduler vs temperd's native backend applying the builtin `redis` profile, side by side.

Usage: python bench/isolation.py [--reps 3] [--ladder 0,1,2,4] [--requests 200000] [--clients 50]

Arms are interleaved per repetition (stock, temperd, stock, temperd, ...) so this noisy host's
drift hits both. Spinners: `stress-ng --cpu N --cpu-method int64`, started from this process,
so they share the benchmark's session (autogroup on). Where the load generator runs: under
stock it floats over both CPUs; under temperd the redis event loop owns CPU 1 and everything
else — redis-benchmark and the spinners included — is kept on CPU 0. The generator competes
with the spinners there, which is the honest cost of a 2-core host. The spinners run in their own
cgroup, bound to the `background` tier in temperd.toml, so under temperd they yield (SCHED_IDLE).
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

import servers as S  # noqa: E402

BINDIR = os.path.dirname(sys.executable)


def run_benchmark(port: int, requests: int, clients: int):
    out = subprocess.run(["redis-benchmark", "-h", "127.0.0.1", "-p", str(port), "-t", "get", "-r", "100000",
                          "-c", str(clients), "-n", str(requests), "--csv"],
                         capture_output=True, text=True, timeout=120)
    rows = list(csv.DictReader(io.StringIO(out.stdout)))
    row = rows[-1]
    return float(row["rps"]), float(row["p50_latency_ms"]), float(row["p99_latency_ms"])


CGROUP_ROOT = "/sys/fs/cgroup/unified" if os.path.isdir("/sys/fs/cgroup/unified") else "/sys/fs/cgroup"
BG_CGROUP = "temperd-bench-background"


def spinners(n: int):
    """The spinners join their own cgroup first, so a [[binding]] can give them the background tier."""
    if n == 0:
        return None
    procs = os.path.join(CGROUP_ROOT, BG_CGROUP, "cgroup.procs")
    return subprocess.Popen(["sh", "-c", f'echo $$ > {procs} && exec stress-ng --cpu {n} --cpu-method int64 --timeout 120'],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def stop(proc):
    if proc is not None and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


PROFILES = os.path.join(HERE, "..", "profiles")


def start_temperd(workdir: str, redis_pid: int, idle_resume_us=None):
    cfg = os.path.join(workdir, "etc")
    os.makedirs(os.path.join(cfg, "profiles.d"), exist_ok=True)
    override = os.path.join(cfg, "profiles.d", "redis.toml")
    if idle_resume_us is not None:
        # The builtin redis profile with an idle-resume bound on the event loop's CPU (per-CPU PM QoS).
        with open(os.path.join(PROFILES, "redis.toml")) as handle:
            text = handle.read()
        marker = 'treatment = "exclusive"\ncpu_fraction = 1.0\n'
        assert marker in text
        with open(override, "w") as handle:
            handle.write(text.replace(marker, marker + f"idle_resume_us = {idle_resume_us}\n"))
    elif os.path.exists(override):
        os.unlink(override)
    run = os.path.join(workdir, "run")
    with open(os.path.join(cfg, "temperd.toml"), "w") as handle:
        handle.write(f'backend = "native"\nstate_dir = "{run}"\n[http]\nport = 0\n[control]\nsocket = "{run}/s"\n'
                     f'[[binding]]\ncgroup = "/{BG_CGROUP}"\ntier = "background"\n')
    proc = subprocess.Popen([os.path.join(BINDIR, "temperd"), "--config", cfg, "--log-level", "warning"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if os.sched_getaffinity(redis_pid) == {1}:
            return proc
        time.sleep(0.1)
    stop(proc)
    raise SystemExit("temperd did not give redis its exclusive CPU in 20 s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--ladder", default="0,1,2,4")
    parser.add_argument("--requests", type=int, default=200000)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--idle-resume-us", type=int, default=None,
                        help="add a third arm: temperd with this idle_resume_us on the event loop (PM QoS)")
    args = parser.parse_args()
    arms = ("stock", "temperd") + (("temperd+pmqos",) if args.idle_resume_us is not None else ())
    ladder = [int(x) for x in args.ladder.split(",")]
    results = {}
    os.makedirs(os.path.join(CGROUP_ROOT, BG_CGROUP), exist_ok=True)
    with S.redis_server() as server, tempfile.TemporaryDirectory() as workdir:
        S.redis_cli(server, "DEBUG", "POPULATE", "100000", "key", "64")
        for rep in range(args.reps):
            for bg in ladder:
                for arm in arms:
                    daemon = None if arm == "stock" else start_temperd(
                        workdir, server.pid, args.idle_resume_us if arm == "temperd+pmqos" else None)
                    spin = spinners(bg)
                    try:
                        time.sleep(0.5)
                        results.setdefault((bg, arm), []).append(run_benchmark(server.port, args.requests, args.clients))
                    finally:
                        stop(spin)
                        stop(daemon)
    try:
        os.rmdir(os.path.join(CGROUP_ROOT, BG_CGROUP))
    except OSError:
        pass
    print(f"redis GET, {args.clients} clients, {args.requests} requests, {args.reps} repetitions (medians)")
    print(f"{'bg':>3} {'arm':<14} {'rps':>9} {'p50 ms':>7} {'p99 ms':>7} {'rps x':>6} {'p99 x':>6}")
    med = {}
    for bg in ladder:
        for arm in arms:
            rows = results[(bg, arm)]
            med[(bg, arm)] = tuple(statistics.median(r[i] for r in rows) for i in range(3))
        for arm in arms:
            rps, p50, p99 = med[(bg, arm)]
            srps, _, sp99 = med[(bg, "stock")]
            print(f"{bg:>3} {arm:<14} {rps:9.0f} {p50:7.3f} {p99:7.3f} {rps / srps:6.2f} {p99 / sp99:6.2f}")
    best = min(med[(bg, "temperd")][2] for bg in ladder)
    top = max(ladder)
    goals = [
        (f"temperd p99 at bg={top} within 1.25x of its best step", med[(top, "temperd")][2] <= 1.25 * best),
        (f"temperd p99 at bg={top} at least 3x better than stock", med[(top, "stock")][2] >= 3 * med[(top, "temperd")][2]),
        ("throughput at bg=0 at least 0.98x stock", 0 in ladder and med[(0, "temperd")][0] >= 0.98 * med[(0, "stock")][0]),
    ]
    for text, ok in goals:
        print(f"{'PASS' if ok else 'MISS'}  {text}")


if __name__ == "__main__":
    main()
