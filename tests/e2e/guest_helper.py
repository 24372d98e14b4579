#!/usr/bin/python3
"""Helpers for the VM test's guest steps (runs on the guest's own Python, stdlib only).

  guest_helper.py snap PID FILE              save each thread's comm, policy, nice, affinity as JSON
  guest_helper.py show PID                   print the threads as a table
  guest_helper.py same FILE PID              exit 1 (and say which) if a thread differs from the snapshot
  guest_helper.py expect PID GLOB KEY=VALUE...   every thread whose comm matches GLOB has these values
                                             (policy: other|fifo|rr|batch|idle; nice: int; affinity: CPU list
                                             like 0-1,3 or "all")
  guest_helper.py json EXPR                  evaluate EXPR on the JSON document on stdin (as d), print it;
                                             exit 1 when it is false or fails
  guest_helper.py get PATH                   print temperd's http://127.0.0.1:9477PATH (/metrics, /observe)
  guest_helper.py latency                    the scheduling delay per layer of the /observe document on stdin
  guest_helper.py p99 LAYER BEFORE AFTER     the p99 (s, interpolated within its bucket as histogram_quantile
                                             does), the count and the mean (s) of LAYER's bpf scheduling-delay
                                             histogram between two /metrics snapshots
"""

import fnmatch
import json
import os
import sys

POLICIES = {0: "other", 1: "fifo", 2: "rr", 3: "batch", 5: "idle", 6: "deadline"}


def threads(pid: int) -> dict:
    out = {}
    for tid in sorted(os.listdir(f"/proc/{pid}/task"), key=int):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as handle:
                comm = handle.read().strip()
            with open(f"/proc/{pid}/task/{tid}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
            affinity = sorted(os.sched_getaffinity(int(tid)))
        except (FileNotFoundError, ProcessLookupError):
            continue  # the thread exited meanwhile
        # After the comm: fields[0] is field 3 (state); nice is field 19, policy field 41.
        out[tid] = {"comm": comm, "policy": POLICIES.get(int(fields[38]), fields[38]),
                    "nice": int(fields[16]), "affinity": affinity}
    return out


def cpu_list(cpus) -> str:
    cpus = sorted(cpus)
    if cpus == list(range(os.cpu_count() or 0)):
        return "all"
    ranges, start = [], None
    for i, cpu in enumerate(cpus):
        if start is None:
            start = cpu
        if i + 1 == len(cpus) or cpus[i + 1] != cpu + 1:
            ranges.append(str(start) if start == cpu else f"{start}-{cpu}")
            start = None
    return ",".join(ranges)


def parse_cpus(text: str):
    if text == "all":
        return list(range(os.cpu_count() or 0))
    out = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        out.extend(range(int(low), int(high or low) + 1))
    return sorted(out)


def show(pid: int) -> int:
    print(f"{'TID':>7} {'COMM':16} {'POLICY':7} {'NICE':>4} AFFINITY")
    for tid, t in threads(pid).items():
        print(f"{tid:>7} {t['comm']:16} {t['policy']:7} {t['nice']:>4} {cpu_list(t['affinity'])}")
    return 0


def same(path: str, pid: int) -> int:
    with open(path) as handle:
        before = json.load(handle)
    now = threads(pid)
    bad = 0
    for tid, old in before.items():
        new = now.get(tid)
        if new is None:
            print(f"thread {tid} ({old['comm']}) is gone")
            bad += 1
            continue
        for key in ("policy", "nice", "affinity"):
            if new[key] != old[key]:
                print(f"thread {tid} ({old['comm']}): {key} {old[key]} before, {new[key]} now")
                bad += 1
    print(f"{len(before)} threads compared, {bad} differences")
    return 1 if bad or not before else 0


def expect(pid: int, glob: str, pairs) -> int:
    want = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        want[key] = int(value) if key == "nice" else parse_cpus(value) if key == "affinity" else value
    matched = bad = 0
    for tid, t in threads(pid).items():
        if not fnmatch.fnmatchcase(t["comm"], glob):
            continue
        matched += 1
        for key, value in want.items():
            if t[key] != value:
                print(f"thread {tid} ({t['comm']}): {key} is {t[key]}, expected {value}")
                bad += 1
    print(f"{matched} thread(s) named {glob!r}: " + ("as expected" if matched and not bad else f"{bad} mismatches"))
    return 0 if matched and not bad else 1


def evaluate(expr: str) -> int:
    try:
        d = json.load(sys.stdin)
        value = eval(expr, {"d": d, "any": any, "all": all, "len": len})  # noqa: S307 - the test's own expressions
    except Exception as exc:  # the document may not be there yet: the caller retries
        print(f"{type(exc).__name__}: {exc}")
        return 1
    print(value if not isinstance(value, (dict, list)) else json.dumps(value))
    return 0 if value else 1


def latency() -> int:
    found = json.load(sys.stdin).get("latency") or {}
    print(f"latency source {found.get('source')} ({found.get('reason')})")

    def ms(value):
        return "-" if value is None else f"{value * 1e3:.3f}"

    for layer in found.get("layers", []):
        print(f"  {layer['layer']:36} window {layer['window_count']:6} total {layer['count']:7}  p50 {ms(layer['p50_s'])} ms  "
              f"p99 {ms(layer['p99_s'])} ms  max {ms(layer['max_s'])} ms  off-CPU {layer.get('offcpu', {})}")
    return 0


def buckets(path: str, layer: str) -> dict:
    """le -> cumulative count of temperd_layer_runqueue_latency_seconds{layer=LAYER,source="bpf"}."""
    out = {}
    prefix = "temperd_layer_runqueue_latency_seconds_bucket{"
    with open(path) as handle:
        for line in handle:
            if not line.startswith(prefix):
                continue
            labels, _, value = line[len(prefix):].rpartition("} ")
            pairs = dict(part.split("=", 1) for part in labels.split(","))
            if pairs.get("layer") == f'"{layer}"' and pairs.get("source") == '"bpf"':
                out[float(pairs["le"].strip('"'))] = float(value)
    return out


def p99(layer: str, before_path: str, after_path: str) -> int:
    """The 0.99 quantile as Prometheus' histogram_quantile gives it (linear within the bucket it
    falls in: log2 buckets are a factor of 2 wide, and two layers' tails often share one), the
    count and the mean, of what the histogram gained between the two snapshots."""
    before, after = buckets(before_path, layer), buckets(after_path, layer)
    grown = sorted((le, n - before.get(le, 0.0)) for le, n in after.items())
    total = grown[-1][1] if grown and grown[-1][0] == float("inf") else 0.0
    if not total:
        print(f"{layer}: no scheduling delay measured between the snapshots")
        return 1
    rank, lower, below = 0.99 * total, 0.0, 0.0
    for le, n in grown:
        if n >= rank:
            quantile = le if le == float("inf") else lower + (le - lower) * (rank - below) / max(n - below, 1e-9)
            break
        lower, below = le, n
    sums = [sum_value(path, layer) for path in (before_path, after_path)]
    print(f"{quantile:.6f} {int(total)} {(sums[1] - sums[0]) / total:.6f}")
    return 0


def sum_value(path: str, layer: str) -> float:
    line_start = f'temperd_layer_runqueue_latency_seconds_sum{{layer="{layer}",source="bpf"}} '
    with open(path) as handle:
        for line in handle:
            if line.startswith(line_start):
                return float(line[len(line_start):])
    return 0.0


def main(argv) -> int:
    if len(argv) >= 3 and argv[0] == "snap":
        with open(argv[2], "w") as handle:
            json.dump(threads(int(argv[1])), handle, indent=1)
        return 0
    if len(argv) == 2 and argv[0] == "show":
        return show(int(argv[1]))
    if len(argv) == 3 and argv[0] == "same":
        return same(argv[1], int(argv[2]))
    if len(argv) >= 4 and argv[0] == "expect":
        return expect(int(argv[1]), argv[2], argv[3:])
    if len(argv) == 2 and argv[0] == "json":
        return evaluate(argv[1])
    if len(argv) == 4 and argv[0] == "p99":
        return p99(argv[1], argv[2], argv[3])
    if argv == ["latency"]:
        return latency()
    if len(argv) == 2 and argv[0] == "get":
        import urllib.request  # here: the other commands run in polling loops, and it is slow to import

        with urllib.request.urlopen(f"http://127.0.0.1:9477{argv[1]}", timeout=20) as reply:
            sys.stdout.write(reply.read().decode())
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
