"""A parallel build (make -j2 of a C project from a Debian source package), with temperd and without.

A build is process churn that no builtin profile matches: make forks a compiler driver per file, and
each driver forks and execs cc1 and as, so temperd sees every fork, exec and exit and has to turn
each process down. The project is the Debian source package --package (default libzstd: zstd's
Makefile, about a hundred C files, compiled at -O3, no configure step), fetched once with
`apt-get source --download-only` and unpacked with `dpkg-source -x` into
~/.cache/temperd-bench/src/ (on a host whose apt lists have no deb-src lines, from a private list
made from its deb lines, in a temporary directory: the host's apt configuration is not changed);
--src DIR builds another unpacked tree instead.

Arms, interleaved and their order reversed every other round: `stock` (no temperd) and `temperd`
(builtin profiles, native backend, started before the build and stopped after it). Each run is
`make clean` (outside the window), then `make -jJOBS` timed: its wall time, the build's CPU (user
+ sys of make and every process it waited for, from wait4), temperd's CPU (utime + stime from
/proc over the window), its process events and replans (its status), and the host's idle, steal
and foreign CPU in the window. An untimed build first warms the page cache. Goals: the build
with temperd at >= 0.98x stock's speed (its time <= stock's / 0.98), and temperd's CPU a small
share of the build's.

    sudo .venv/bin/python bench/build_churn.py [--rounds 2] [--jobs 2] [--package libzstd] [--src DIR]
        [--target T] [--tree DIR] [--json FILE]
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from typing import Dict, List, Optional, Sequence

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (HostMonitor, NoiseLimits, host_description, median, running_temperd,  # noqa: E402
                    tree_command, wait_for_quiet)
from interleaved import (arguments, arm_order, daemon_counts, grown, needs_root, num, quieter_of_two,  # noqa: E402
                         ratio_verdict, report)

SPEED_GOAL = 0.98
CACHE = os.path.join(os.path.expanduser("~"), ".cache", "temperd-bench", "src")
BUILD_TIMEOUT_S = 600


# ---- the source -----------------------------------------------------------------------------------


def deb_src_sources(text: str) -> str:
    """deb-src lines for apt sources: one-line `deb URI SUITE ...` entries and deb822 stanzas
    (`Types: deb`) both turned into their source counterparts; everything else kept."""
    out = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("deb ") or stripped.startswith("deb\t"):
            out.append("deb-src" + stripped[3:])
        elif stripped.lower().startswith("types:"):
            out.append("Types: deb-src" if "deb" in stripped.split()[1:] else line)
        else:
            out.append(line)
    return "\n".join(out) + "\n"


def _apt(args: Sequence[str], cwd: str, private: Optional[str]) -> subprocess.CompletedProcess:
    options = [] if private is None else ["-o", "Dir::Etc::SourceList=/dev/null", "-o", f"Dir::Etc::SourceParts={private}",
                                          "-o", f"Dir::State::Lists={private}/lists"]
    return subprocess.run(["apt-get", "-q", *options, *args], cwd=cwd, capture_output=True, text=True, timeout=600)


def fetch_source(package: str, cache: str = CACHE) -> str:
    """The unpacked tree of Debian source package `package` under `cache` (fetched on first use)."""
    tree = os.path.join(cache, package)
    if os.path.exists(os.path.join(tree, "Makefile")):
        return tree
    os.makedirs(cache, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="temperd-bench-apt-") as scratch:
        fetched = _apt(["source", "--download-only", package], scratch, None)
        if fetched.returncode != 0:  # no deb-src lines: a private list made from the deb ones
            private = os.path.join(scratch, "apt")
            os.makedirs(os.path.join(private, "lists", "partial"))
            texts = [open(path).read() for path in ["/etc/apt/sources.list", *sorted(glob.glob("/etc/apt/sources.list.d/*"))]
                     if os.path.isfile(path) and path.endswith((".list", ".sources"))]
            for index, text in enumerate(texts):
                suffix = ".sources" if "Types:" in text else ".list"
                with open(os.path.join(private, f"src{index}{suffix}"), "w") as handle:
                    handle.write(deb_src_sources(text))
            updated = _apt(["update"], scratch, private)
            if updated.returncode != 0:
                raise SystemExit(f"apt-get update (deb-src) failed: {updated.stderr.strip()[-500:]}")
            fetched = _apt(["source", "--download-only", package], scratch, private)
            if fetched.returncode != 0:
                raise SystemExit(f"apt-get source {package} failed: {fetched.stderr.strip()[-500:]}")
        dsc = glob.glob(os.path.join(scratch, "*.dsc"))
        if not dsc:
            raise SystemExit(f"apt-get source {package} left no .dsc")
        unpacked = subprocess.run(["dpkg-source", "-x", "--skip-patches", dsc[0], tree], capture_output=True,
                                  text=True, timeout=300)
        if unpacked.returncode != 0:
            raise SystemExit(f"dpkg-source -x failed: {unpacked.stderr.strip()[-500:]}")
    return tree


def source_version(tree: str) -> str:
    try:
        with open(os.path.join(tree, "debian", "changelog")) as handle:
            first = handle.readline().split()
        return f"{first[0]} {first[1].strip('()')}"
    except (OSError, IndexError):
        return os.path.basename(tree)


# ---- a run ---------------------------------------------------------------------------------------


def make(tree: str, args: Sequence[str], timeout_s: float = BUILD_TIMEOUT_S):
    """make ARGS in `tree`; (wall s, user + sys s of make and what it waited for, exit status)."""
    with open(os.devnull, "w") as null:
        t0 = time.monotonic()
        proc = subprocess.Popen(["make", "-C", tree, *args], stdout=null, stderr=subprocess.STDOUT)
        deadline = t0 + timeout_s
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                proc.kill()
                pid, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.02)
        wall = time.monotonic() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    return wall, usage.ru_utime + usage.ru_stime, proc.returncode


def one_run(tree: str, arm: str, round_no: int, args) -> Dict[str, object]:
    def once(quiet: str) -> Dict[str, object]:
        if make(tree, ["clean"], 120)[2] != 0:
            raise SystemExit(f"make clean failed in {tree}")
        if arm == "stock":
            return dict(measure(tree, arm, round_no, args, None), quiet_before=quiet)
        with running_temperd(command=tree_command(args.tree)) as daemon:
            time.sleep(2.0)  # the start's scan and first plan out of the window
            return dict(measure(tree, arm, round_no, args, daemon), quiet_before=quiet)

    return quieter_of_two(once)


def measure(tree: str, arm: str, round_no: int, args, daemon) -> Dict[str, object]:
    hz = os.sysconf("SC_CLK_TCK")
    counts0 = daemon_counts(daemon)
    monitor = HostMonitor()
    monitor.start()
    ticks0 = daemon.cpu_ticks() if daemon else 0
    wall, build_cpu, status = make(tree, [f"-j{args.jobs}", *([args.target] if args.target else [])])
    ticks1 = daemon.cpu_ticks() if daemon else 0
    window = monitor.stop()
    counts1 = daemon_counts(daemon)
    if status != 0:
        raise SystemExit(f"make -j{args.jobs} failed (status {status}) in {tree}")
    cpu_s = (ticks1 - ticks0) / hz if daemon else None
    counts = grown(counts0, counts1)
    return {"round": round_no, "arm": arm, "wall_s": wall, "build_cpu_s": build_cpu, "daemon_cpu_s": cpu_s,
            "daemon_share_of_build_pct": 100.0 * cpu_s / build_cpu if cpu_s is not None and build_cpu else None,
            "daemon_cpu_pct_of_core": 100.0 * cpu_s / wall if cpu_s is not None else None,
            "events": counts["events"], "replans": counts["replans"],
            "host_idle_pct": window.idle_pct, "host_steal_pct": window.steal_pct,
            "foreign_cpu_pct_of_core": window.foreign_core_pct, "foreign_top": window.foreign_top,
            "noisy": window.noisy(NoiseLimits())}


# ---- the report (pure) --------------------------------------------------------------------------


def speed_ratios(runs: Sequence[Dict[str, object]]) -> List[float]:
    """Per round: stock's wall time / temperd's (1.0 = as fast; the goal is >= 0.98)."""
    by_round: Dict[int, Dict[str, float]] = {}
    for r in runs:
        by_round.setdefault(int(r["round"]), {})[str(r["arm"])] = float(r["wall_s"])  # type: ignore[arg-type]
    return [p["stock"] / p["temperd"] for _, p in sorted(by_round.items()) if "stock" in p and p.get("temperd")]


def table(runs: Sequence[Dict[str, object]]) -> str:
    """One Markdown row per run."""
    lines = ["| round | arm | build wall s | build CPU s (user + sys) | temperd CPU s | temperd ÷ build CPU | "
             "temperd % of a core | process events | replans | host idle / steal / foreign |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        lines.append(
            f"| {r['round']} | {r['arm']} | {float(r['wall_s']):.2f} | {float(r['build_cpu_s']):.1f} | "  # type: ignore
            f"{num(r['daemon_cpu_s'], '.2f')} | "
            f"{'-' if r['daemon_share_of_build_pct'] is None else format(r['daemon_share_of_build_pct'], '.2f') + ' %'} | "
            f"{num(r['daemon_cpu_pct_of_core'], '.1f')} | {num(r['events'], 'd')} | {num(r['replans'], 'd')} | "
            f"{float(r['host_idle_pct']):.0f} / {float(r['host_steal_pct']):.1f} / "  # type: ignore
            f"{float(r['foreign_cpu_pct_of_core']):.0f} % |")  # type: ignore
    return "\n".join(lines)


def verdicts(runs: Sequence[Dict[str, object]]) -> List[str]:
    ratios = speed_ratios(runs)
    ours = [r for r in runs if r["arm"] == "temperd" and r["daemon_cpu_s"] is not None]
    out = []
    if ratios:
        out.append(ratio_verdict("build speed", SPEED_GOAL, ratios))
    if ours:
        cpu = [float(r["daemon_cpu_s"]) for r in ours]  # type: ignore[arg-type]
        share = [float(r["daemon_share_of_build_pct"]) for r in ours]  # type: ignore[arg-type]
        out.append(f"temperd's CPU: median {median(cpu):.2f} s, {median(share):.2f} % of the build's CPU "
                   f"(runs {', '.join(f'{x:.2f}' for x in share)} %)")
    return out


def main() -> int:
    parser = arguments(__doc__)
    parser.add_argument("--jobs", type=int, default=2, help="make -jJOBS")
    parser.add_argument("--package", default="libzstd", help="the Debian source package to build")
    parser.add_argument("--src", help="build this unpacked tree (its Makefile) instead")
    parser.add_argument("--target", default="", help="make target (default: the Makefile's)")
    args = parser.parse_args()
    if needs_root():
        return 2
    if shutil.which("make") is None or shutil.which("cc") is None:
        print("make and cc are needed (Debian packages make, gcc)", file=sys.stderr)
        return 2
    tree = args.src or fetch_source(args.package)
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    quiet = wait_for_quiet(60.0)
    print(host_description())
    print(f"started {started}; before the first run: {quiet.describe()}")
    print(f"{source_version(tree)}: make -j{args.jobs} {args.target}; temperd from {args.tree or 'this checkout'}")
    make(tree, ["clean"], 120)
    warm = make(tree, [f"-j{args.jobs}", *([args.target] if args.target else [])])
    print(f"warm-up build (untimed): {warm[0]:.1f} s, status {warm[2]}", flush=True)
    if warm[2] != 0:
        return 1
    runs: List[Dict[str, object]] = []
    for round_no in range(1, args.rounds + 1):
        for arm in arm_order(round_no):
            run = one_run(tree, arm, round_no, args)
            runs.append(run)
            print(f"round {round_no} {arm}: {run['wall_s']:.2f} s, temperd {num(run['daemon_cpu_s'], '.2f')} s",
                  flush=True)
    report(runs, table, verdicts, args.json, started=started, quiet_before=asdict(quiet),
           source=source_version(tree), tree=args.tree or ".")
    return 0


if __name__ == "__main__":
    sys.exit(main())
