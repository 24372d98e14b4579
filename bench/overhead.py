"""temperd's own CPU use as a share of one core: idle host, and with 2 000 extra threads alive.

Usage: python bench/overhead.py [--seconds 60] [--threads 2000]

temperd runs with the native backend and the builtin profiles (HTTP on a free loopback port);
its CPU is utime+stime of the whole process (all threads) from /proc/PID/stat, measured over
the window after start-up has settled. Start-up (first scan, plan, apply) is shown separately.
Goal: <= 0.13 % of one core.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))

from reconcile import HOLDER  # noqa: E402

from temperd.procfs import read_process_cpu_ticks  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")
BINDIR = os.path.dirname(sys.executable)


def measure(seconds: float, extra_threads: int):
    holder = None
    if extra_threads:
        holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(extra_threads)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert holder.stdout.readline().strip() == "ready"
    with tempfile.TemporaryDirectory() as tmp:
        run = os.path.join(tmp, "run")
        with open(os.path.join(tmp, "temperd.toml"), "w") as handle:
            handle.write(f'backend = "native"\nstate_dir = "{run}"\n[http]\nport = 0\n[control]\nsocket = "{run}/s"\n')
        daemon = subprocess.Popen([os.path.join(BINDIR, "temperd"), "--config", tmp, "--log-level", "warning"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 20
            while not os.path.exists(os.path.join(run, "s")) and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(2)  # let start-up and the first observation pass
            start_ticks = read_process_cpu_ticks(daemon.pid)
            t0 = time.monotonic()
            time.sleep(seconds)
            end_ticks = read_process_cpu_ticks(daemon.pid)
            wall = time.monotonic() - t0
        finally:
            daemon.terminate()
            daemon.wait(timeout=20)
            if holder:
                holder.stdin.close()
                holder.wait(timeout=10)
    return start_ticks / TICK, (end_ticks - start_ticks) / TICK / wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--threads", type=int, default=2000)
    args = parser.parse_args()
    print(f"temperd CPU over {args.seconds:g} s (native backend, builtin profiles)")
    print(f"{'scenario':<22} {'start-up CPU s':>15} {'steady % of a core':>19}")
    for label, threads in (("idle host", 0), (f"+{args.threads} threads", args.threads)):
        startup, ratio = measure(args.seconds, threads)
        print(f"{label:<22} {startup:15.2f} {ratio * 100:19.3f}")
    print("goal: <= 0.13 % of one core (CPU time resolution: 1 clock tick = 10 ms)")


if __name__ == "__main__":
    main()
