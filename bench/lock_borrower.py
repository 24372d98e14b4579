"""A yielding thread that holds a lock the owner of an exclusive CPU wants, on a crowded host.

bench/lock_borrower.c runs two threads of one process: `lb-owner` wakes every 10 ms, takes a
mutex and works 100 us; `lb-holder` works 1 ms holding the mutex, then 4 ms without it. Two
`stress-ng --cpu` spinners (untreated, the standard tier) crowd this 2-CPU host. The owner's
lock wait is how long the holder, once it yields, keeps the owner from its work: SCHED_IDLE has
no priority inheritance, so a holder that yields to the spinners holds the owner up with it.

Arms, interleaved, each measured for --seconds after its settings are in place:
- stock: nothing changed;
- by-hand: the owner pinned to CPU 1 (`taskset`), the holder SCHED_IDLE (`chrt --idle`);
- temperd-owned / temperd-fenced: temperd with a profile that makes the owner an exclusive group
  (ownership "owned": others borrow its CPU while it sleeps; "fenced": nobody else runs there)
  and the holder a yield group (SCHED_IDLE);
- temperd-owned-batch: owned, and the holder's yield group `yield_policy = "batch"` (SCHED_BATCH,
  nice 19: a small share of the CPU rather than none while others want it).

    sudo .venv/bin/python bench/lock_borrower.py [--seconds 10] [--reps 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Dict, List

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import HostMonitor, host_description, running_temperd  # noqa: E402

from temperd.sources import procfs  # noqa: E402
from temperd.sources.shape import online_cpus  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ARMS = ("stock", "by-hand", "temperd-owned", "temperd-fenced", "temperd-owned-batch")
OWNER_CPU = 1


def profile(ownership: str, yield_policy: str) -> str:
    return f"""schema_version = 1
id = "lock-borrower"
description = "bench/lock_borrower.py: an owner and a yielding lock holder"
[fingerprint]
process_names = ["lock_borrower"]
[[thread_groups]]
name = "owner"
thread_names = ["lb-owner"]
treatment = "exclusive"
ownership = "{ownership}"
[[thread_groups]]
name = "holder"
thread_names = ["lb-holder"]
treatment = "yield"
yield_policy = "{yield_policy}"
"""


def tids(pid: int) -> Dict[str, int]:
    """The program's threads by name."""
    return {stat.comm: tid for tid, stat in (procfs.read_thread_stats(pid) or {}).items()}


def treated(pid: int) -> bool:
    names = tids(pid)
    return (os.sched_getscheduler(names["lb-holder"]) in (os.SCHED_IDLE, os.SCHED_BATCH)
            and len(os.sched_getaffinity(names["lb-owner"])) < len(online_cpus()))


def run_arm(arm: str, binary: str, seconds: float) -> dict:
    proc = subprocess.Popen([binary, str(int(seconds))], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        names = tids(proc.pid)
        if arm == "by-hand":
            subprocess.run(["taskset", "-p", "-c", str(OWNER_CPU), str(names["lb-owner"])], check=True,
                           stdout=subprocess.DEVNULL)
            subprocess.run(["chrt", "--idle", "-p", "0", str(names["lb-holder"])], check=True)
        elif arm.startswith("temperd"):
            deadline = time.monotonic() + 20
            while not treated(proc.pid):  # the daemon treats it on its process events
                assert time.monotonic() < deadline, f"{arm}: not treated within 20 s"
                time.sleep(0.05)
        owner_cpus = sorted(os.sched_getaffinity(names["lb-owner"]))
        monitor = HostMonitor()
        monitor.start()
        proc.stdin.write("go\n")
        proc.stdin.flush()
        result = json.loads(proc.stdout.readline())
        window = monitor.stop()
        result["foreign_core_pct"] = window.foreign_core_pct
        result["owner_cpus"] = owner_cpus
        return result
    finally:
        proc.kill()
        proc.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if os.geteuid() != 0 or shutil.which("cc") is None or shutil.which("stress-ng") is None:
        print("run as root, with cc and stress-ng installed", file=sys.stderr)
        return 2
    workdir = tempfile.mkdtemp(prefix="lock-borrower-")
    binary = os.path.join(workdir, "lock_borrower")
    subprocess.run(["cc", "-O1", "-pthread", "-o", binary, os.path.join(HERE, "lock_borrower.c")], check=True)
    spinners = subprocess.Popen(["stress-ng", "--cpu", "2", "--quiet"])
    results: Dict[str, List[dict]] = {arm: [] for arm in ARMS}
    try:
        time.sleep(1.0)
        for rep in range(args.reps):
            for arm in ARMS:
                if arm.startswith("temperd"):
                    ownership = arm.split("-")[1]
                    policy = "batch" if arm.endswith("-batch") else "idle"
                    with running_temperd(profiles={"lock-borrower.toml": profile(ownership, policy)}):
                        results[arm].append(run_arm(arm, binary, args.seconds))
                else:
                    results[arm].append(run_arm(arm, binary, args.seconds))
    finally:
        spinners.terminate()
        spinners.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        json.dump(results, sys.stdout, indent=1)
        print()
        return 0
    print(host_description())
    print(f"two stress-ng --cpu spinners; {args.reps} interleaved repetitions of {args.seconds:g} s; "
          "owner: 100 us under the lock every 10 ms; holder: 1 ms under it, then 4 ms")
    print(f"{'arm':<20} {'lock wait p50 us':>17} {'p99 us':>9} {'max us':>9} {'late p99 us':>12} "
          f"{'owner rounds':>13} {'holder rounds':>14} {'foreign %':>10}")
    for arm in ARMS:
        runs = results[arm]
        median = sorted(runs, key=lambda r: r["lock_wait_us"]["p99"])[len(runs) // 2]
        p99s = ", ".join(str(r["lock_wait_us"]["p99"]) for r in runs)
        print(f"{arm:<20} {median['lock_wait_us']['p50']:>17} {median['lock_wait_us']['p99']:>9} "
              f"{median['lock_wait_us']['max']:>9} {median['late_us']['p99']:>12} {median['owner_rounds']:>13} "
              f"{median['holder_rounds']:>14} {median['foreign_core_pct']:>10.1f}   (p99s {p99s})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
