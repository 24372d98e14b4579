"""What a process that no profile matches costs temperd: a loop that runs /bin/true at a set rate.

temperd runs with the builtin profiles (and the native backend); a generator forks and execs
/bin/true --rate times a second for --duration seconds, for each rate given. The daemon's CPU is
read from /proc before and after (its CPU time per exec does not depend on what else the host
runs), over an idle window first and then each rate; the CPU per exec is what it spent above
its idle rate, per exec. Its replans come from its status. --tree DIR runs the temperd package found in DIR (another
checkout) instead of this one, for a side-by-side comparison.

    sudo .venv/bin/python bench/exec_loop.py [--rates 50,500] [--duration 30] [--tree DIR] [--json] [--py-spy OUT]

--py-spy OUT samples the daemon with py-spy during each rate's window (raw stacks into OUT.RATE; top printed).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Dict, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import HostMonitor, host_description, print_py_spy, py_spy_record, running_temperd, tree_command  # noqa: E402


def generate(rate: float, duration: float) -> int:
    """Fork and exec /bin/true at `rate` per second (paced, not bursty); how many ran."""
    made = 0
    start = time.monotonic()
    while True:
        now = time.monotonic()
        if now - start >= duration:
            return made
        due = start + made / rate
        if due > now:
            time.sleep(due - now)
        subprocess.run(["/bin/true"], check=False)
        made += 1


def measure(daemon, rate: float, duration: float, spy_out: Optional[str] = None) -> Dict[str, object]:
    hz = os.sysconf("SC_CLK_TCK")
    status0 = daemon.status(timeout=30)
    replans0, events0 = int(status0["replans"]), int(status0["inventory"]["events_received"])
    monitor = HostMonitor()
    monitor.start()
    spy = py_spy_record(daemon.pid, duration, spy_out) if spy_out else None
    ticks0, t0 = daemon.cpu_ticks(), time.monotonic()
    made = generate(rate, duration) if rate > 0 else time.sleep(duration) or 0
    wall = time.monotonic() - t0
    ticks1 = daemon.cpu_ticks()
    window = monitor.stop()
    if spy is not None:
        spy.wait()
    status1 = daemon.status(timeout=30)
    replans1, events1 = int(status1["replans"]), int(status1["inventory"]["events_received"])
    cpu_s = (ticks1 - ticks0) / hz
    return {"rate_asked": rate, "rate_made": made / wall, "execs": made, "cpu_s": cpu_s, "wall_s": wall,
            "daemon_cpu_pct_of_core": 100.0 * cpu_s / wall,
            "replans": replans1 - replans0, "events": events1 - events0,
            "daemon_cpu_us_per_event": 1e6 * cpu_s / (events1 - events0) if events1 > events0 else None, "host_idle_pct": window.idle_pct,
            "foreign_cpu_pct_of_core": window.foreign_core_pct, "foreign_top": window.foreign_top}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="50,500", help="execs per second, comma-separated")
    parser.add_argument("--duration", type=float, default=30.0, help="seconds per rate")
    parser.add_argument("--tree", help="run the temperd package of this checkout")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--py-spy", dest="py_spy", metavar="OUT",
                        help="sample temperd with py-spy during each rate (raw stacks into OUT.RATE; top printed)")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("run as root: temperd changes other processes' scheduling", file=sys.stderr)
        return 2
    rows = []
    with running_temperd(command=tree_command(args.tree)) as daemon:
        time.sleep(2.0)  # the start's scan and first plan out of the window
        idle = measure(daemon, 0.0, args.duration)  # the daemon's own cost without the loop, subtracted below
        for rate in (float(r) for r in args.rates.split(",")):
            rows.append(measure(daemon, rate, args.duration, f"{args.py_spy}.{rate:.0f}" if args.py_spy else None))
    for row in [idle] + rows:
        above = row["cpu_s"] - idle["cpu_s"] * row["wall_s"] / idle["wall_s"]  # type: ignore[operator]
        row["daemon_cpu_us_per_exec"] = 1e6 * above / row["execs"] if row["execs"] else None
    if args.json:
        json.dump({"host": host_description(), "tree": args.tree or ".", "idle": idle, "rows": rows}, sys.stdout, indent=1)
        print()
        return 0
    print(host_description())
    print(f"temperd from {args.tree or 'this checkout'}; builtin profiles; /bin/true exec'd for {args.duration:.0f} s per rate")
    print("us/exec: the daemon's CPU above its own idle window's rate, per exec; us/event: all of its CPU per "
          "process event it received (the host's other processes' events count too)")
    print(f"{'asked/s':>8} {'made/s':>7} {'% core':>7} {'us/exec':>8} {'events/s':>9} {'us/event':>9} {'replans':>8} "
          f"{'idle %':>7} {'foreign % core':>15}")
    for r in [idle] + rows:
        per, per_event = r["daemon_cpu_us_per_exec"], r["daemon_cpu_us_per_event"]
        print(f"{r['rate_asked']:>8.0f} {r['rate_made']:>7.0f} {r['daemon_cpu_pct_of_core']:>7.2f} "
              f"{'-' if per is None else f'{per:.0f}':>8} {r['events'] / r['wall_s']:>9.0f} "
              f"{'-' if per_event is None else f'{per_event:.0f}':>9} "
              f"{r['replans']:>8} {r['host_idle_pct']:>7.0f} "
              f"{r['foreign_cpu_pct_of_core']:>15.0f}  {r['foreign_top'] or ''}")
    if args.py_spy:
        for r in rows:
            print(f"\n== py-spy at {r['rate_asked']:.0f}/s ==")
            print_py_spy(f"{args.py_spy}.{r['rate_asked']:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
