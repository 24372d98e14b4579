"""Churn against a running temperd: threads, renames and processes created at a set rate.

A generator process (comm `tmpd-churn`) creates, each at --rate per second for --duration
seconds: threads named `chw-N` (a yield group of its profile selects them), threads born
`chx-N` (no group selects them) that rename themselves `chw-N` 0.3 s later, and processes
(`/bin/sleep` with argv[0] `tmpd-churn-proc`, matched by command line, every thread yields).
Each thread, after being created or renamed, checks its own policy at 2, 5, 10, 20, 50, 100,
200, 500, 1000 and 2000 ms; the generator checks each process's the same way. "Treated within"
is the first check that saw SCHED_BATCH, so latencies have that resolution. The daemon's CPU and
RSS are read from /proc before and after, the process events it received and its event
overflows from /metrics: CPU per process event is the event path's cost. --py-spy OUT samples
the daemon during the churn and prints where its time went; --stages times each stage of the
passes over process events (bench/pass_stages.py); --tree DIR runs the temperd package found in DIR
(another checkout, side by side).

    sudo .venv/bin/python bench/churn.py [--rate 300] [--duration 60] [--tree DIR] [--json] [--py-spy OUT] [--stages]
"""

from __future__ import annotations

import argparse
import ctypes
import heapq
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from typing import Dict, List, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (ROOT, HostMonitor, host_description, print_py_spy, py_spy_record, read_text,  # noqa: E402
                    running_temperd, tree_command)
import pass_stages  # noqa: E402
from servers import free_port  # noqa: E402  (common puts tests/ on sys.path)

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

CHECKS_MS = (2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000)
SCHED_BATCH = os.SCHED_BATCH
RENAME_AFTER_S = 0.3
PROC_ARGV0 = "tmpd-churn-proc"

THREAD_PROFILE = """schema_version = 1
id = "tmpd-churn"
description = "bench/churn.py: the generator's chw-* threads yield"
[fingerprint]
process_names = ["tmpd-churn"]
[[thread_groups]]
name = "churned"
thread_names = ["chw-*"]
treatment = "yield"
yield_policy = "batch"
nice = 5
"""

PROCESS_PROFILE = f"""schema_version = 1
id = "tmpd-churn-proc"
description = "bench/churn.py: churned processes yield"
[fingerprint]
cmdline = ["^{PROC_ARGV0} "]
[[thread_groups]]
name = "all"
catch_all = true
treatment = "yield"
yield_policy = "batch"
nice = 5
"""


# ---- the generator (a process of its own, so that its CPU is not the daemon's) ----------------

def _set_comm(name: str) -> None:
    ctypes.CDLL(None).prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME


def _first_treated_ms(check) -> Optional[int]:
    start = time.monotonic()
    for at_ms in CHECKS_MS:
        delay = start + at_ms / 1000.0 - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        if check():
            return at_ms
    return None


def _thread_body(index: int, rename: bool, out: List) -> None:
    if rename:
        _set_comm(f"chx-{index}")
        time.sleep(RENAME_AFTER_S)
    _set_comm(f"chw-{index}")
    out.append(_first_treated_ms(lambda: os.sched_getscheduler(0) == SCHED_BATCH))


def _process_policy(pid: int) -> Optional[int]:
    try:
        return os.sched_getscheduler(pid)
    except OSError:  # gone
        return None


def generate(rate: float, duration: float) -> dict:
    _set_comm("tmpd-churn")
    results: Dict[str, List] = {"threads": [], "renames": [], "processes": []}
    lock = threading.Lock()
    due: List = []  # heap of (check time, pid, started, check index) for processes
    children: List[subprocess.Popen] = []
    counts = {"threads": 0, "renames": 0, "processes": 0}
    start = time.monotonic()
    end = start + duration
    next_at = {kind: start for kind in counts}
    period = 1.0 / rate

    def checker():
        while True:
            with lock:
                item = due[0] if due else None
            if item is None:
                if time.monotonic() > end + 3:
                    return
                time.sleep(0.001)
                continue
            at, pid, born, index = item
            delay = at - time.monotonic()
            if delay > 0:
                time.sleep(min(delay, 0.001))
                continue
            with lock:
                heapq.heappop(due)
            if _process_policy(pid) == SCHED_BATCH:
                results["processes"].append(CHECKS_MS[index])
            elif index + 1 < len(CHECKS_MS):
                with lock:
                    heapq.heappush(due, (born + CHECKS_MS[index + 1] / 1000.0, pid, born, index + 1))
            else:
                results["processes"].append(None)

    checking = threading.Thread(target=checker, daemon=True)
    checking.start()
    while True:
        now = time.monotonic()
        if now >= end:
            break
        kind = min(next_at, key=next_at.get)
        if next_at[kind] > now:
            time.sleep(next_at[kind] - now)
        next_at[kind] += period
        counts[kind] += 1
        if kind == "processes":
            child = subprocess.Popen([PROC_ARGV0, "2.5"], executable="/bin/sleep", close_fds=True)
            children.append(child)
            born = time.monotonic()
            with lock:
                heapq.heappush(due, (born + CHECKS_MS[0] / 1000.0, child.pid, born, 0))
        else:
            threading.Thread(target=_thread_body, args=(counts[kind], kind == "renames", results[kind]),
                             daemon=True).start()
        if len(children) > 64:
            children = [c for c in children if c.poll() is None]
    elapsed = time.monotonic() - start
    time.sleep(RENAME_AFTER_S + CHECKS_MS[-1] / 1000.0 + 0.5)
    checking.join(10)
    for child in children:
        child.kill()
        child.wait()
    return {"elapsed_s": elapsed, "counts": counts, "results": results}


# ---- the benchmark ------------------------------------------------------------------------------

def rss_kib(pid: int) -> int:
    for line in read_text(f"/proc/{pid}/status").splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def inventory_counts(port: int) -> Dict[str, Optional[float]]:
    """Process events received and event-buffer overflows since start, from /metrics (updated at
    each observation sample, every 5 s)."""
    found: Dict[str, Optional[float]] = {"temperd_inventory_events": None, "temperd_inventory_event_overflows": None}
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
            text = reply.read().decode()
    except OSError:
        return found
    for family in text_string_to_metric_families(text):
        if family.name in found:
            found[family.name] = sum(sample.value for sample in family.samples)
    return found


def status_counts(daemon) -> Dict[str, Optional[float]]:
    """From the daemon's status, since start: its replans (each a pass of match, plan and apply),
    and the passes that handled process events with their CPU time (None from a temperd that
    does not count them)."""
    try:
        status = daemon.status(timeout=30)
    except (RuntimeError, subprocess.TimeoutExpired):
        status = {}
    path = status.get("event_path") or {}
    return {"replans": status.get("replans"), "event_passes": path.get("passes"), "event_cpu_s": path.get("cpu_s")}


def _grown(before: Dict[str, Optional[float]], after: Dict[str, Optional[float]], name: str) -> Optional[float]:
    return None if before[name] is None or after[name] is None else after[name] - before[name]


def percentile(values: List[int], q: float) -> Optional[int]:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=300.0, help="per second, for each of the three kinds")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of churn")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--py-spy", dest="py_spy", metavar="OUT",
                        help="sample temperd with py-spy during the churn (raw stacks into OUT; top printed)")
    parser.add_argument("--tree", help="run the temperd package of this checkout")
    parser.add_argument("--stages", action="store_true",
                        help="time each stage of the passes over process events (bench/pass_stages.py) and print them")
    parser.add_argument("--generate", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.generate:
        json.dump(generate(args.rate, args.duration), sys.stdout)
        return 0
    if os.geteuid() != 0:
        print("run as root: temperd changes other processes' scheduling", file=sys.stderr)
        return 2
    port = free_port()
    profiles = {"churn.toml": THREAD_PROFILE, "churn-proc.toml": PROCESS_PROFILE}
    stages = os.path.join(tempfile.mkdtemp(prefix="churn-stages-"), "passes.json") if args.stages else None
    command = pass_stages.command(args.tree or ROOT, stages) if stages else tree_command(args.tree)
    with running_temperd(profiles=profiles, http_port=port, command=command) as daemon:
        time.sleep(1.0)
        ticks0, rss0, counts0, status0 = daemon.cpu_ticks(), rss_kib(daemon.pid), inventory_counts(port), status_counts(daemon)
        monitor = HostMonitor()
        monitor.start()
        spy = py_spy_record(daemon.pid, args.duration, args.py_spy) if args.py_spy else None
        t0 = time.monotonic()
        out = subprocess.run([sys.executable, os.path.abspath(__file__), "--generate", "--rate", str(args.rate),
                              "--duration", str(args.duration)], capture_output=True, text=True,
                             timeout=args.duration + 60)
        wall = time.monotonic() - t0
        window = monitor.stop()
        ticks1, rss1, status1 = daemon.cpu_ticks(), rss_kib(daemon.pid), status_counts(daemon)
        time.sleep(5.5)  # one more observation sample: /metrics counts the window's last events
        ticks2, counts1 = daemon.cpu_ticks(), inventory_counts(port)
        alive = daemon.alive()
        if spy is not None:
            spy.wait(timeout=60)
    if out.returncode != 0:
        print(out.stderr[-2000:], file=sys.stderr)
        return 1
    gen = json.loads(out.stdout)
    hz = os.sysconf("SC_CLK_TCK")
    rows = []
    for kind in ("threads", "renames", "processes"):
        seen = gen["results"][kind]
        treated = [v for v in seen if v is not None]
        rows.append({
            "kind": kind, "requested_per_s": args.rate, "achieved_per_s": gen["counts"][kind] / gen["elapsed_s"],
            "created": gen["counts"][kind], "checked": len(seen), "treated_share": len(treated) / max(1, len(seen)),
            "p50_ms": percentile(treated, 0.5), "p99_ms": percentile(treated, 0.99),
            "within_100ms_share": sum(1 for v in treated if v <= 100) / max(1, len(seen))})
    cpu_s = (ticks1 - ticks0) / hz
    events = _grown(counts0, counts1, "temperd_inventory_events")
    cpu_to_count_s = (ticks2 - ticks0) / hz  # over the same span as the events counted
    made = sum(gen["counts"].values())
    passes, event_passes, event_cpu_s = (_grown(status0, status1, name) for name in ("replans", "event_passes", "event_cpu_s"))
    summary = {
        "host": host_description(), "tree": args.tree or ".", "duration_s": args.duration,
        "daemon_cpu_pct_of_core": 100.0 * cpu_s / wall,
        "daemon_cpu_ms_per_event": 1000.0 * cpu_to_count_s / events if events else None,
        "daemon_cpu_ms_per_creation": 1000.0 * cpu_to_count_s / made if made else None,
        "process_events": events,
        "replans": passes, "replans_per_s": passes / wall if passes is not None else None,
        "daemon_cpu_ms_per_replan": 1000.0 * cpu_s / passes if passes else None,
        "event_passes_per_s": event_passes / wall if event_passes is not None else None,
        "event_cpu_ms_per_pass": 1000.0 * event_cpu_s / event_passes if event_passes and event_cpu_s is not None else None,
        "event_cpu_pct_of_core": 100.0 * event_cpu_s / wall if event_cpu_s is not None else None,
        "daemon_rss_kib_before": rss0, "daemon_rss_kib_after": rss1,
        "event_overflows": _grown(counts0, counts1, "temperd_inventory_event_overflows"),
        "daemon_survived": alive,
        "host_idle_pct": window.idle_pct, "host_steal_pct": window.steal_pct,
        "foreign_cpu_pct_of_core": window.foreign_core_pct, "foreign_top": window.foreign_top,
        "rows": rows,
    }
    if args.json:
        json.dump(summary, sys.stdout, indent=1)
        print()
        return 0
    print(summary["host"])
    print(f"temperd from {args.tree or 'this checkout'}")
    print(f"churn for {args.duration:.0f} s; checks at {', '.join(map(str, CHECKS_MS))} ms after creation or rename")
    print(f"{'kind':<10} {'asked/s':>8} {'made/s':>7} {'made':>6} {'checked':>7} {'treated':>8} {'<=100ms':>8} "
          f"{'p50 ms':>7} {'p99 ms':>7}")
    for r in rows:
        print(f"{r['kind']:<10} {r['requested_per_s']:>8.0f} {r['achieved_per_s']:>7.0f} {r['created']:>6} "
              f"{r['checked']:>7} {100 * r['treated_share']:>7.1f}% {100 * r['within_100ms_share']:>7.1f}% "
              f"{str(r['p50_ms']):>7} {str(r['p99_ms']):>7}")
    print(f"daemon: {summary['daemon_cpu_pct_of_core']:.1f} % of a core during the churn, RSS {rss0 / 1024:.1f} -> "
          f"{rss1 / 1024:.1f} MiB, event overflows {summary['event_overflows']}, "
          f"{'running' if alive else 'EXITED'} at the end")
    per_event = summary["daemon_cpu_ms_per_event"]
    print(f"daemon CPU per process event: {'-' if per_event is None else f'{per_event:.3f}'} ms "
          f"({summary['process_events']:.0f} events); per thread, rename or process made: "
          f"{summary['daemon_cpu_ms_per_creation'] or 0:.3f} ms")
    if passes is not None:
        print(f"replans: {passes} ({passes / wall:.1f}/s), {summary['daemon_cpu_ms_per_replan'] or 0:.2f} ms of "
              "daemon CPU per replan (all of its CPU over the churn, divided)")
    if summary["event_cpu_ms_per_pass"] is not None:
        print(f"event path (the daemon's own count): {summary['event_passes_per_s']:.1f} passes/s, "
              f"{summary['event_cpu_ms_per_pass']:.2f} ms of main-loop CPU per pass, "
              f"{summary['event_cpu_pct_of_core']:.1f} % of a core")
    print(f"host: idle {window.idle_pct:.0f} %, steal {window.steal_pct:.1f} %, foreign CPU "
          f"{window.foreign_core_pct:.0f} % of a core ({window.foreign_top or 'none'})")
    if args.py_spy:
        print_py_spy(args.py_spy)
    if stages:
        print("\n".join(pass_stages.table(stages, wall)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
