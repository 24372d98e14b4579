"""Isolation: a server from its Debian or PyPI package under its standard load generator while
CPU spinners crowd the host, under several arms: the stock scheduler, what an operator does by
hand, and temperd.

Usage (root, from the checkout):
  .venv/bin/python bench/isolation.py                     # redis, open loop at 0.5 and 0.8 of stock's rate
  .venv/bin/python bench/isolation.py --quick             # smoke run: 1 repetition, bg 0 and 4
  .venv/bin/python bench/isolation.py --server memcached  # see --help for the servers
  options: --reps N --ladder 0,1,2,4 --load 0.5,0.8 --arms stock,by-hand,temperd,temperd+bg
           --seconds S --run-timeout S --trained-profile FILE --train SECONDS --profile-arm NAME=FILE --json FILE
  closed loop (as fast as answered: throughput; a faster arm gets more load): --closed, or --variants c=50,c=1
  the Markdown of a run's JSON (docs/benchmarks.md and README.md carry it): --markdown FILE [--summary]
  e.g. the trained profile against stock and the builtin (temperctl train under the first closed-loop
  variant's load for 20 s first, the profile kept beside --json):
  .venv/bin/python bench/isolation.py --train 20 --arms stock,temperd+bg,trained --ladder 0,4 --reps 5
  and a hand-edited variant of a trained profile beside it, in the same interleaved runs:
  .venv/bin/python bench/isolation.py --server jvm --trained-profile jvm.toml --profile-arm edited=jvm-edited.toml
  an untagged CPU-busy service beside the server (2 stress-ng workers, standard tier) in every run:
  .venv/bin/python bench/isolation.py --neighbour 2 --arms stock,by-hand,temperd+bg

Open loop (bench/openloop.py; redis and memcached: memtier_benchmark, PostgreSQL: pgbench -R, MariaDB:
sysbench --rate; the others have none and run closed loop): first, on the idle host and before any
arm, stock's rate with the same generator running closed loop (median of three runs); each --load
is a fraction of it, offered at the same rate to every arm. A run whose achieved rate is below 0.95x
the offered one did not carry the load: it has no p99, and the tables say "not sustained". Where
each generator's latency starts (memtier's does not include a late send) is in bench/openloop.py.

What runs (bench/workloads.py has each server and its load; bench/arms.py each arm):
- The server in its own session (as a service manager starts it) and in a cgroup v2 directory
  of its own; its load generator and the spinners in this script's session (one autogroup, as a
  batch job started beside a benchmark shell), or with --spinner-session own the spinners in a
  session of their own (as a service manager starts a batch job: with autogroups on, a session's
  policies and nices rank its threads only against each other, so this decides whether a
  spinner's SCHED_IDLE or a session's autogroup nice is what yields). The spinners (`stress-ng
  --cpu N --cpu-method int64`, time-bounded) start in another cgroup of their own. No controller
  is enabled in those directories: they only name the processes for temperd's bindings.
- Arms (bench/arms.py): stock, by-hand (the server pinned with `taskset -a -p -c CPUS PID` to
  the CPUs temperd gives it, the spinners under `nice -n 19 chrt --idle 0`), temperd (builtin
  profile, critical tier, spinners untagged), temperd+bg (spinners bound to the background
  tier); opt-in: temperd-nopoll, temperd+bg-nopoll (no resume bound on the owned CPUs), scx, scx+bg, trained (--trained-profile, or
  --train SECONDS: `temperctl train --direct` on the server under the first variant's load, before
  the runs; the profile is printed and kept).
  Interleaved within every step, the order reversed every other repetition; an arm is left (temperd
  stopped, the server unpinned) before the next enters, and stock runs check that the host was
  put back.
- Per run (temperd.training.harness): the host's idle and steal share and the CPU of processes
  outside this benchmark (foreign, % of one core); a run with foreign > --noisy-foreign or steal >
  --noisy-steal is repeated once (at most --max-retries in all) and the quieter kept. The load
  generator's and the server's runqueue wait (schedstat) over the run: `cwait%` and `swait%`
  are that wait as a share of the run's wall time, `cdelay%` the load generator's share of the
  time it wanted a CPU that it spent waiting. `IPI/s`: rescheduling IPIs over all CPUs
  (/proc/interrupts): how often one CPU made another reschedule.
- Where the load generator runs: on a 2-CPU host it is a local process competing for CPU. Under
  stock it floats over both CPUs; under temperd and by hand the server owns one CPU and the load
  generator is left the other (the `client ran on` column: its last CPU, sampled every 50 ms;
  the server's main thread, each spinner worker and each neighbour worker are sampled the same
  way). A process-per-connection server's backends, forked during the run, count in `swait%`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional, Sequence, Tuple

import arms as A  # bench/arms.py
import common as C  # bench/common.py; also puts the checkout and tests/ on sys.path
import docblocks  # bench/docblocks.py
import openloop as O  # bench/openloop.py
import openloop_report as R  # bench/openloop_report.py
import workloads as W  # bench/workloads.py
from isolation_report import (goals, markdown_table, parse_step, print_goals, print_scx, print_table,  # noqa: E402
                              run_json, runs_from_json, step_name, verdict)

import servers as S  # noqa: E402  (tests/servers.py)
from temperd.backends.native.autogroup import read_autogroup  # noqa: E402
from temperd.backends.native.sched import POLICY_NAMES  # noqa: E402
from temperd.sources import procfs  # noqa: E402
from temperd.training import harness as T  # noqa: E402


# ---- one run ---------------------------------------------------------------------------------------------


class PlacementSampler:
    """Where a process last ran, sampled: CPU -> share of samples."""

    def __init__(self) -> None:
        self.counts: Dict[str, Dict[int, int]] = {}

    def sample(self, label: str, pid: int) -> None:
        cpu = C.last_cpu(pid)
        if cpu is not None:
            table = self.counts.setdefault(label, {})
            table[cpu] = table.get(cpu, 0) + 1

    def describe(self, label: str) -> str:
        table = self.counts.get(label) or {}
        total = sum(table.values())
        if not total:
            return "-"
        return " ".join(f"{cpu}:{100 * n // total}%" for cpu, n in sorted(table.items()))


class Bench:
    """One server under its load, every arm, every step."""

    def __init__(self, workload: W.Workload, server, under: A.ServerUnderTest, arms: Dict[str, A.BenchArm],
                 amounts: Dict[str, int], timeout_s: float, pmqos_originals: Dict[int, str],
                 spinners_own_session: bool = False, neighbour: int = 0,
                 neighbour_cgroup: Optional[T.ScratchCgroup] = None):
        self.workload = workload
        self.spinners_own_session = spinners_own_session
        self.neighbour = neighbour  # CPU-busy workers of an untagged service beside the server
        self.neighbour_cgroup = neighbour_cgroup
        self.server = server
        self.under = under
        self.arms = arms
        self.amounts = amounts
        self.timeout_s = timeout_s
        self.pmqos_originals = pmqos_originals
        self.settle_s = 0.5
        self.open_seconds = 0  # open loop: each run this long at amounts[variant] per second (0: closed loop)

    def run(self, step: str, arm_name: str, rep: int) -> T.Run:
        variant, bg = parse_step(step)
        run = T.Run(step, arm_name, rep, notes={"variant": variant, "bg": bg, "amount": self.amounts[variant]})
        arm = self.arms[arm_name]
        C.wait_until(lambda: not other_temperds(), OTHER_TEMPERD_WAIT_S, 1.0)
        others = other_temperds()
        if others:
            run.error = (f"another temperd (pid {', '.join(map(str, others))}) runs on this host: "
                         "its plan moves this benchmark's processes")
            return run
        if arm_name == A.STOCK:
            run.error = A.restored_host(self.under.pids(), self.pmqos_originals)
            if run.error:
                return run
        metrics, neighbour_metrics = _metrics_path("spinners"), _metrics_path("neighbour")
        try:
            with contextlib.ExitStack() as stack:
                # The neighbour runs first, as a service that was there before any arm: untagged, its
                # own session and cgroup, no wrapper (an operator tuning the server leaves it alone).
                neighbour = stack.enter_context(T.spinners(
                    self.neighbour, self.timeout_s + 60, self.neighbour_cgroup, own_session=True,
                    metrics=neighbour_metrics))

                def start_spinners() -> List[int]:
                    return stack.enter_context(
                        T.spinners(bg, self.timeout_s + 30, self.under.spinner_cgroup, arm.spinner_wrapper,
                                   own_session=self.spinners_own_session, metrics=metrics))

                workers = start_spinners() if arm.spinners_first else None
                notes = stack.enter_context(arm.enter())
                run.notes.update(notes)
                exclusive = frozenset(int(c) for c in str(notes.get("exclusive", "")).split(",") if c.isdigit())
                if workers is None:
                    workers = start_spinners()
                run.error = self._spinners_ready(arm, exclusive, workers)
                if run.error:
                    return run
                if workers:
                    run.notes["spinners_allowed"] = C.cpulist(C.affinity_of(workers[0]) or ())
                    run.notes["spinners_policy"] = POLICY_NAMES.get(_policy(workers[0]), "?")
                if arm.settle is not None:
                    run.error = arm.settle(workers)
                    if run.error:
                        return run
                time.sleep(self.settle_s)
                if arm.during is None:
                    self._measure(run, variant, workers, neighbour)
                else:
                    with arm.during() as during:
                        self._measure(run, variant, workers, neighbour)
                    run.notes.update(during)
                others = other_temperds()
                if others and run.ok:
                    run.error = f"another temperd (pid {', '.join(map(str, others))}) started during the run"
        except (RuntimeError, subprocess.SubprocessError, OSError) as exc:
            run.error = str(exc)
        finally:
            ops_per_cpu_s = T.bogo_ops_per_cpu_s(metrics) if bg else 0.0
            neighbour_ops_per_cpu_s = T.bogo_ops_per_cpu_s(neighbour_metrics) if self.neighbour else None
            for path in (metrics, neighbour_metrics):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
        # The background work done in the window: the spinners' CPU seconds in it, at the bogo-ops
        # per CPU second stress-ng reported for its whole run; the neighbour's the same way.
        for label, metric, note, per_cpu_s in (
                ("spinners", "bg_ops_s", "bg_ops_per_cpu_s", ops_per_cpu_s),
                ("neighbour", "neighbour_ops_s", "neighbour_ops_per_cpu_s", neighbour_ops_per_cpu_s)):
            spun = run.waits.get(label)
            if run.ok and spun is not None and spun.seconds > 0 and per_cpu_s is not None:
                run.metrics[metric] = spun.run_s * per_cpu_s / spun.seconds
                run.notes[note] = round(per_cpu_s, 1)
        return run

    @staticmethod
    def _spinners_ready(arm: A.BenchArm, exclusive: frozenset, workers: Sequence[int]) -> str:
        if arm.spinners_kept_off and exclusive and workers:
            off = C.wait_until(lambda: all(not ((C.affinity_of(w) or exclusive) & exclusive) for w in workers), 5.0)
            if not off:
                return "spinners were not kept off the exclusive CPU within 5 s"
        if arm.spinner_policy is not None and workers:
            if not C.wait_until(lambda: all(_policy(w) == arm.spinner_policy for w in workers), 5.0):
                return f"spinners did not get {POLICY_NAMES.get(arm.spinner_policy)} within 5 s"
        return ""

    def _measure(self, run: T.Run, variant: str, spinners: Sequence[int] = (), neighbour: Sequence[int] = ()) -> None:
        workload = self.workload
        sampler = PlacementSampler()
        monitor = T.HostMonitor()
        meter = T.WaitMeter()
        server_pids = self.under.pids()
        monitor.start()
        meter.start(server=server_pids, client=[], spinners=list(spinners), neighbour=list(neighbour))
        # Output into a file, not a pipe: a load generator that writes more than a pipe holds (pgbench's
        # per-transaction log) would block on it while this loop only polls.
        output = tempfile.TemporaryFile("w+")
        out_dir = tempfile.mkdtemp(prefix="temperd-bench-load-")  # memtier's JSON
        proc = subprocess.Popen(self._load_argv(variant, out_dir), stdout=output, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, text=True)
        meter.follow("client", proc.pid)
        deadline = time.monotonic() + self.timeout_s
        allowed = set()
        followed = set(server_pids)
        try:
            while proc.poll() is None:
                if time.monotonic() >= deadline:
                    run.error = f"{workload.tool} did not finish within {self.timeout_s:.0f} s"
                    return
                # A process-per-connection server forks its backends during the run: their wait counts.
                for pid in self.under.pids():
                    if pid not in followed:
                        followed.add(pid)
                        meter.follow("server", pid)
                for label, pids in (("client", [proc.pid]), ("server", server_pids[:1]), ("spinners", spinners),
                                    ("neighbour", neighbour)):
                    for pid in pids:
                        sampler.sample(label, pid)
                for found in C.thread_affinities(proc.pid):  # a load generator may pin its threads (memcaslap does)
                    allowed.add(C.cpulist(found))
                meter.sample()
                time.sleep(0.05)
            output.seek(0)
            stdout = output.read()
        finally:
            run.window = monitor.stop()
            run.waits = meter.stop()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            output.close()
        run.notes.update(client_cpus=sampler.describe("client"), server_cpus=sampler.describe("server"),
                         spinner_cpus=sampler.describe("spinners"), neighbour_cpus=sampler.describe("neighbour"),
                         client_allowed="/".join(sorted(allowed)) or "-")
        try:
            self._result(run, variant, proc.returncode, stdout, out_dir)
        finally:
            shutil.rmtree(out_dir, ignore_errors=True)

    def _load_argv(self, variant: str, out_dir: str) -> List[str]:
        if self.open_seconds:  # open loop: the variant is a load, its amount the offered rate
            return self.workload.open_argv(self.server, self.amounts[variant], self.open_seconds, out_dir)
        return self.workload.load_argv(self.server, variant, self.amounts[variant])

    def _result(self, run: T.Run, variant: str, returncode: int, stdout: str, out_dir: str) -> None:
        """The load generator's answer into the run's metrics (or its error). Open loop: offered,
        achieved and, only where the rate was sustained, p50 and p99."""
        tool = self.workload.open_tool if self.open_seconds else self.workload.tool
        try:
            if self.open_seconds:
                found = self.workload.parse_open(stdout, out_dir, self.amounts[variant])
                # sysbench ends a run whose event queue overflowed with a failure: not sustained, not an error
                if returncode == 0 or not found.sustained:
                    run.metrics = found.metrics()
                    return
            elif returncode == 0:
                m = self.workload.parse(stdout)
                run.metrics = {"rate": m.rate, "p50_ms": m.p50_ms, "p99_ms": m.p99_ms}
                return
        except ValueError as exc:
            if returncode == 0:
                run.error = str(exc)
                return
        run.error = f"{tool} exited with {returncode}: {stdout.strip()[-200:]}"


OTHER_TEMPERD_WAIT_S = 120.0


def _metrics_path(what: str) -> str:
    """A path for stress-ng's YAML metrics, absent until stress-ng ends and writes it."""
    handle = tempfile.NamedTemporaryFile(prefix=f"temperd-bench-{what}-", suffix=".yaml", delete=False)
    handle.close()
    os.unlink(handle.name)
    return handle.name


def other_temperds() -> List[int]:
    """temperd daemons this benchmark did not start (another user's test on a shared host): while
    one runs, its plan keeps every process -- ours included -- off its exclusive CPUs."""
    procs = T.all_proc_cpu()
    ours = T.descendants(os.getpid(), procs)
    found = []
    for pid in procs:
        argv = procfs.read_cmdline(pid) or ()
        if pid not in ours and any(os.path.basename(a) == "temperd" for a in argv[:2]):
            found.append(pid)
    return found


def _policy(pid: int) -> Optional[int]:
    try:
        return os.sched_getscheduler(pid)
    except OSError:
        return None


# ---- the whole benchmark ----------------------------------------------------------------------------------


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", choices=sorted(W.WORKLOADS), default="redis")
    parser.add_argument("--reps", type=int, default=3, help="repetitions per step (default 3)")
    parser.add_argument("--ladder", default="0,1,2,4", help="spinner counts (default 0,1,2,4)")
    parser.add_argument("--load",
                        help="open loop (the default where the server has an open-loop generator): offered rates as "
                             "fractions of what stock serves on the idle host, measured first in the same run and "
                             "held equal across arms (default 0.5,0.8); with --markdown --summary, the loads shown")
    parser.add_argument("--closed", action="store_true",
                        help="closed loop instead: the load generator sends as fast as it is answered (throughput; "
                             "a faster arm is measured at a higher load)")
    parser.add_argument("--memtier", metavar="PATH", help="memtier_benchmark for redis and memcached (default: "
                        "$TEMPERD_MEMTIER, a cached build, PATH, else built from ../shared/memtier/ or $TEMPERD_MEMTIER_SRC)")
    parser.add_argument("--variants", help="closed-loop load variants (implies --closed; default: the workload's, e.g. "
                        "c=50,c=1 for redis)")
    parser.add_argument("--seconds", type=float,
                        help="length of a run: open loop, whole seconds (default 5); closed loop, of a stock bg=0 run "
                             "(default 2.5)")
    parser.add_argument("--arms", default=",".join(A.DEFAULT_ARMS),
                        help=f"arms (default {','.join(A.DEFAULT_ARMS)}; also {A.NOPOLL}, {A.NOPOLL_BG}, {A.SCX}, "
                             f"{A.SCX_BG}, {A.SCX_BARE}, {A.TRAINED}); bench/arms.py says what each does")
    parser.add_argument("--trained-profile", metavar="FILE", help="the profile the trained arm applies")
    parser.add_argument("--profile-arm", action="append", default=[], metavar="NAME=FILE",
                        help="one more arm like trained, named NAME, applying the profile FILE (a variant to compare "
                             "with the trained profile side by side); repeatable, added to --arms")
    parser.add_argument("--train", type=float, metavar="SECONDS",
                        help="train the trained arm's profile first: temperctl train for SECONDS under the first "
                             "variant's load (written to --trained-profile, else beside --json)")
    parser.add_argument("--spinner-session", choices=("beside", "own"), default="beside",
                        help="the spinners in this script's session beside the load generator (default), or in a "
                             "session of their own, as a service manager starts a batch job")
    parser.add_argument("--neighbour", type=int, default=0, metavar="N",
                        help="an untagged CPU-busy service beside the server in every run: N stress-ng workers in a "
                             "session and cgroup of their own, in the standard tier (no binding; by hand left alone); "
                             "its work in each window is reported beside the background's (default 0: none)")
    parser.add_argument("--warm", type=float, default=35.0, metavar="SECONDS",
                        help="before the runs, temperd watches the server under the first variant's load this long "
                             "(default 35 s; 0: not), so every temperd arm sizes the exclusive group from a history, "
                             "as a temperd running for a while does; the arms share that history file")
    parser.add_argument("--quick", action="store_true", help="smoke run: 1 repetition, bg 0 and 4")
    parser.add_argument("--noisy-foreign", type=float, default=10.0,
                        help="%% of a core used by other processes that marks a run noisy")
    parser.add_argument("--noisy-steal", type=float, default=5.0, help="steal %% that marks a run noisy")
    parser.add_argument("--max-retries", type=int, default=8, help="noisy runs repeated, in all (default 8)")
    parser.add_argument("--max-minutes", type=float, default=30.0, help="stop starting runs after this long")
    parser.add_argument("--run-timeout", type=float, metavar="S",
                        help="a run whose load generator has not finished by then is an error (default: the larger "
                             "of 60 s and 12 x --seconds; give more under software emulation)")
    parser.add_argument("--json", metavar="FILE", help="write every run as JSON")
    parser.add_argument("--note", default="", metavar="TEXT",
                        help="what the JSON (and the tables made from it) should say of this run, e.g. \"smoke run on a "
                             "busy host\"")
    parser.add_argument("--markdown", metavar="JSON", help="print the Markdown tables of --json files (comma-separated, "
                        "pooled; open-loop files: one table per offered load, and the goals) and exit")
    parser.add_argument("--update-docs", action="store_true",
                        help="write the generated tables of README.md and docs/benchmarks.md again from the JSON "
                             "their markers name (bench/docblocks.py), and exit")
    parser.add_argument("--summary", action="store_true",
                        help="with --markdown (open-loop files, one per server): the short results table only")
    args = parser.parse_args(argv)
    args.error = parser.error
    if args.quick:
        args.reps, args.ladder = 1, "0,4"
    return args


def markdown(args: argparse.Namespace) -> str:
    """The Markdown of --json files: closed loop, the tables of old; open loop, per offered load the
    table and the goals, or with --summary the short results table (README.md's). Reads nothing but
    the files: docs carry this text between markers, and a test keeps it in step with the files."""
    datasets = [runs_from_json(path) for path in args.markdown.split(",")]
    if all(data.get("mode") == "open" for data, _ in datasets):
        if args.summary:
            loads = O.parse_loads(args.load) if args.load else None
            return "\n".join([R.summary_caption(datasets), "", R.summary_table(datasets, loads), "",
                              R.reproduce(datasets)])
        return "\n\n".join(open_markdown(data, runs) for data, runs in datasets)
    data, runs = datasets[-1][0], [r for _, more in datasets for r in more]  # several runs of one workload pooled
    workload = W.WORKLOADS[data["workload"]]()
    ladder = [int(x) for x in args.ladder.split(",")]
    out = []
    for variant in data["amounts"]:
        out += [f"{workload.name} {variant}:", "",
                markdown_table(workload.name, workload.rate_unit, variant, ladder, list(data["arms"]), runs), ""]
        out += [f"- {arm}, {text}: **{verdict(met, firm)}** ({numbers})" for arm in data["arms"]
                if arm not in (A.STOCK, A.BY_HAND) for text, met, firm, numbers in
                goals(variant, ladder, runs, arm, workload.name, workload.p99_resolution)]
    return "\n".join(out)


def open_markdown(data: dict, runs: List[T.Run]) -> str:
    """One open-loop JSON: per offered load, its table and the goals' verdicts."""
    ladder = R.ladder_of(runs)
    out = []
    for variant in R.variants_of(runs):
        out.append(f"{data['workload']}, offered {O.fraction_of(variant):g} × stock's idle rate "
                   f"({R.count(data['capacity'])}/s): {R.count(data['amounts'][variant])}/s")
        out += ["", R.markdown_open_table(variant, ladder, list(data["arms"]), runs), ""]
        out += R.goals_lines(variant, ladder, list(data["arms"]), runs, float(data.get("p99_resolution", 1.0)))
        out.append("")
    return "\n".join(out).rstrip("\n")


def preflight() -> int:
    """0 where this process may run the bench; else 2, with why on stderr."""
    if os.geteuid() != 0:
        print("isolation.py: must run as root (temperd changes scheduling settings of other processes)", file=sys.stderr)
        return 2
    own = read_autogroup(os.getpid())
    if own is not None and own[1] != 0:  # the load generator and the spinners run in this session
        print(f"isolation.py: this session's autogroup {own[0]} has nice {own[1]}, which weighs the load generator "
              f"and the spinners against the server; expected 0 (echo 0 > /proc/{os.getpid()}/autogroup)",
              file=sys.stderr)
        return 2
    return 0


def arm_names_of(args: argparse.Namespace, workload: W.Workload) -> Tuple[List[str], Dict[str, str]]:
    """The arms asked for (the trained arm added by --train, the --profile-arm arms after them)."""
    arm_names = [a for a in args.arms.split(",") if a]
    if args.train:
        if not args.trained_profile:
            args.trained_profile = f"{os.path.splitext(args.json)[0] if args.json else workload.name}-trained.toml"
        if A.TRAINED not in arm_names:
            arm_names.append(A.TRAINED)
    elif A.TRAINED in arm_names and not args.trained_profile:
        args.error("the trained arm needs --trained-profile FILE (or --train SECONDS)")
    profile_arms = dict(spec.split("=", 1) for spec in args.profile_arm if "=" in spec)
    if len(profile_arms) != len(args.profile_arm) or set(profile_arms) & set(arm_names) - set(profile_arms):
        args.error("--profile-arm takes NAME=FILE, NAME a new arm's name")
    return arm_names + [name for name in profile_arms if name not in arm_names], profile_arms


def main() -> int:
    args = parse_args()
    if args.markdown:
        print(markdown(args))
        return 0
    if args.update_docs:
        changed = docblocks.update(lambda argv: markdown(parse_args(argv)))
        print("written again: " + (", ".join(changed) or "nothing (every table in step with its JSON)"))
        return 0
    signal.signal(signal.SIGTERM, _interrupted)  # stop like Ctrl-C: servers stopped, cgroups removed
    refused = preflight()
    if refused:
        return refused
    workload = W.WORKLOADS[args.server]()
    args.closed = args.closed or bool(args.variants)  # --variants names closed-loop loads
    args.open = not args.closed and bool(workload.open_tool)
    if not args.closed and not args.open:
        print(f"isolation.py: {workload.name} has no open-loop load generator: closed loop", flush=True)
    if args.open:
        args.open_seconds = max(1, math.ceil(args.seconds or OPEN_SECONDS))
        try:
            args.loads = O.parse_loads(args.load or DEFAULT_LOADS)
            if isinstance(workload, W.MemtierLoad):
                workload.memtier = O.memtier_binary(args.memtier)
        except (ValueError, O.GeneratorUnavailable) as exc:
            print(f"isolation.py: {exc}", file=sys.stderr)
            return 2
    args.seconds = args.seconds or CLOSED_SECONDS
    if args.quick:
        args.seconds = min(args.seconds, 1.5)
    arm_names, profile_arms = arm_names_of(args, workload)
    limits = T.NoiseLimits(args.noisy_foreign, args.noisy_steal)
    started = time.monotonic()
    print(C.host_description())
    load_average = C.load_average()
    print(f"started {time.strftime('%Y-%m-%d %H:%M:%S %Z')}, load average {load_average:.2f}")
    args.host_state = (f"{args.note + '; ' if args.note else ''}load average {load_average:.2f} at the start; "
                       f"before the first run: {_quiet_state(T.wait_for_quiet(60.0, limits))}")
    print(args.host_state)
    runs: List[T.Run] = []
    args.amounts, args.capacity, args.arm_descriptions = {}, 0.0, {n: n for n in arm_names}
    try:
        run_bench(args, workload, arm_names, profile_arms, limits, started, runs)
    except KeyboardInterrupt:
        print("interrupted: results so far", flush=True)
    except S.ServerUnavailable as exc:
        print(f"isolation.py: {exc}", file=sys.stderr)
        return 2
    if not runs:
        print("no runs completed", file=sys.stderr)
        return 1
    report(args, workload, arm_names, runs, started)
    if args.json:
        write_json(args, workload, runs)
    return 0


OPEN_SECONDS, CLOSED_SECONDS = 5.0, 2.5
DEFAULT_LOADS = "0.5,0.8"
CAPACITY_SPREAD = 0.2  # stock's three idle-host runs further apart than this (of their median): said so


def run_bench(args: argparse.Namespace, workload: W.Workload, arm_names: List[str], profile_arms: Dict[str, str],
              limits: T.NoiseLimits, started: float, runs: List[T.Run]):
    """The server up, its load sized (closed loop) or stock's idle-host rate measured (open loop),
    every arm built, then every run interleaved; runs are appended to `runs` as they come, and
    args gets the amounts, stock's idle-host rate and the arms' descriptions."""
    history_dir = tempfile.mkdtemp(prefix="temperd-bench-history-")  # the temperd arms' shared history
    try:
        with workload.server() as server, T.ScratchCgroup(T.scratch_name("server")) as server_cgroup, \
                T.ScratchCgroup(T.scratch_name("spinners")) as spinner_cgroup, \
                T.ScratchCgroup(T.scratch_name("neighbour")) as neighbour_cgroup:
            under = A.ServerUnderTest(workload.name, workload.profile_id, workload.exclusive_group, server_cgroup,
                                      spinner_cgroup, lambda: workload.pids(server),
                                      lambda cpus: workload.treated(server, cpus), args.trained_profile,
                                      workload.expects_exclusive, profile_arms,
                                      os.path.join(history_dir, "usage-history.json"))
            for pid in under.pids():
                server_cgroup.add(pid)
            workload.prepare(server)
            timeout_s = args.run_timeout or max(60.0, 12 * args.seconds)
            variants, amounts, args.capacity = size_loads(args, workload, server, timeout_s)
            args.amounts = amounts
            closed_variant = workload.variants[0]  # training and warming run the closed-loop load
            if args.train:
                A.train_profile(workload, server, closed_variant, args.train, args.trained_profile, timeout_s)
            if args.warm > 0 and workload.exclusive_group:
                group = A.warm_history(workload, server, under, closed_variant, args.warm, timeout_s)
                print(f"after {args.warm:g} s under {closed_variant}'s load, temperd plans the "
                      f"{workload.exclusive_group} group: {group}")
            by_hand_cpus = A.planned_cpus(under) if A.BY_HAND in arm_names else frozenset()
            arms = A.make_arms(under, by_hand_cpus)
            unknown = [a for a in arm_names if a not in arms]
            if unknown or A.STOCK not in arm_names:
                args.error(f"--arms: expected stock plus any of {', '.join(arms)}, found {args.arms!r}")
            bench = Bench(workload, server, under, arms, amounts, timeout_s, A.pmqos_values(),
                          spinners_own_session=args.spinner_session == "own", neighbour=args.neighbour,
                          neighbour_cgroup=neighbour_cgroup)
            bench.open_seconds = args.open_seconds if args.open else 0
            describe_setup(args, workload, server, bench, arm_names, by_hand_cpus)
            ladder = [int(x) for x in args.ladder.split(",")]
            steps = [step_name(v, bg) for v in variants for bg in ladder]
            planned = len(steps) * len(arm_names) * args.reps
            print(f"{planned} runs: {len(steps)} steps x {len(arm_names)} arms x {args.reps} repetitions, interleaved")
            plan = T.TrialPlan(steps, lambda step: arm_names, args.reps, limits, args.max_retries,
                               started + args.max_minutes * 60)

            def progress(run: T.Run) -> None:
                runs.append(run)
                _progress(len(runs), planned, run, started)

            args.arm_descriptions = {n: arms[n].description for n in arm_names}
            try:
                T.run_trials(plan, bench.run, progress)
            except T.OutOfTime:
                print(f"stopping: --max-minutes {args.max_minutes:g} reached", flush=True)
    finally:
        shutil.rmtree(history_dir, ignore_errors=True)


def size_loads(args: argparse.Namespace, workload: W.Workload, server, timeout_s: float):
    """(variants, amount of each, stock's idle-host rate). Closed loop: each variant's work sized
    to --seconds. Open loop: stock's rate on the idle host (this process's arms not entered yet, no
    spinners) measured with the open-loop generator running closed loop, the median of three runs;
    each load a fraction of it."""
    if not args.open:
        variants = args.variants.split(",") if args.variants else list(workload.variants)
        return variants, {v: workload.size(server, v, args.seconds, timeout_s) for v in variants}, 0.0
    workload.prepare_open(server)
    rates = []
    for _ in range(3):
        with tempfile.TemporaryDirectory(prefix="temperd-bench-load-") as out_dir:
            out = subprocess.run(workload.open_argv(server, None, args.open_seconds, out_dir), capture_output=True,
                                 text=True, timeout=timeout_s)
            if out.returncode != 0:
                raise SystemExit(f"{workload.open_tool} (closed loop) exited with {out.returncode}: "
                                 f"{(out.stdout + out.stderr).strip()[-300:]}")
            rates.append(workload.parse_open(out.stdout, out_dir, None).achieved)
    capacity = T.median(rates)
    args.capacity_runs = [round(r, 1) for r in rates]
    print(f"stock on the idle host, {workload.open_tool} without a rate (closed loop, {workload.open_connections()} "
          "connections): "
          + ", ".join(f"{r:,.0f}" for r in rates) + f"/s; median {capacity:,.0f}/s")
    if capacity and (max(rates) - min(rates)) / capacity > CAPACITY_SPREAD:
        print(f"  those runs spread over more than {CAPACITY_SPREAD:.0%} of their median: the host was not quiet, and "
              "every offered rate below is a fraction of an uncertain figure", flush=True)
    variants = [O.load_variant(x) for x in args.loads]
    return variants, {O.load_variant(x): workload.offered_rate(x * capacity) for x in args.loads}, capacity


def describe_setup(args, workload: W.Workload, server, bench: "Bench", arm_names: Sequence[str], by_hand_cpus) -> None:
    if args.open:
        work = ", ".join(f"{v}: {workload.describe_open(a, args.open_seconds)}" for v, a in bench.amounts.items())
    else:
        work = ", ".join(f"{v}: {a}" for v, a in bench.amounts.items())
    print(f"{workload.name} {workload.version(server)} pid {server.pid} in cgroup {bench.under.server_cgroup.relative}, "
          f"spinners in {bench.under.spinner_cgroup.relative} and "
          f"{'a session of their own' if bench.spinners_own_session else 'this session'}; work per run: {work}")
    if args.neighbour:
        print(f"an untagged neighbour beside it: {args.neighbour} stress-ng worker(s) in "
              f"{bench.neighbour_cgroup.relative}, a session of their own, standard tier")
    for name in arm_names:
        print(f"  arm {name}: {bench.arms[name].description}")
    if A.BY_HAND in arm_names:
        print(f"  by-hand pins the server to CPU(s) {C.cpulist(by_hand_cpus)} (what temperd gives it)")


def report(args, workload: W.Workload, arm_names: List[str], runs: List[T.Run], started: float) -> None:
    ladder = [int(x) for x in args.ladder.split(",")]
    amounts = args.amounts
    if args.open:
        data = {"workload": workload.name, "arms": {n: n for n in arm_names}, "amounts": amounts,
                "capacity": args.capacity, "p99_resolution": workload.open_resolution}
        print()
        print(open_markdown(data, runs))
        print(f"\nlatency: {O.LATENCY_FROM[workload.open_tool]}")
    else:
        for variant in amounts:
            print_table(workload, variant, ladder, arm_names, runs, amounts[variant])
        if workload.notes:
            print(f"\nNote: {workload.notes}.")
        print_scx(runs)
        print("\ncwait% / swait%: runqueue wait (schedstat) of the load generator / the server's threads, % of the run;")
        print("cdly%: the load generator's wait as a share of the time it wanted a CPU (run + wait).")
        for variant in amounts:
            print_goals(workload, variant, ladder, arm_names, runs)
    retried = sum(r.retried for r in runs)
    print(f"\n{len(runs)} runs in {(time.monotonic() - started) / 60:.1f} min, {retried} repeated as noisy; "
          f"finished {time.strftime('%H:%M:%S')}")


def write_json(args, workload: W.Workload, runs: List[T.Run]) -> None:
    data = {"host": C.host_description(), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "workload": workload.name, "amounts": args.amounts, "spinner_session": args.spinner_session,
            "neighbour": args.neighbour, "arms": args.arm_descriptions, "host_state": args.host_state,
            "repetitions": args.reps,
            "command": "bench/isolation.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])}
    if args.open:
        data.update(mode="open", capacity=args.capacity, capacity_runs=getattr(args, "capacity_runs", []), seconds=args.open_seconds, generator=workload.open_tool,
                    latency_from=O.LATENCY_FROM[workload.open_tool], p99_resolution=workload.open_resolution)
    else:
        data.update(mode="closed", seconds=args.seconds)
    data["runs"] = [run_json(r) for r in runs]
    with open(args.json, "w") as handle:
        json.dump(data, handle, indent=1)


def _quiet_state(window: T.HostWindow) -> str:
    """The host before the runs, without naming its busiest foreign process (kept per run in the JSON)."""
    return f"idle {window.idle_pct:.0f} %, steal {window.steal_pct:.1f} %, foreign {window.foreign_core_pct:.1f} % of a core"


def _interrupted(signum, frame) -> None:
    raise KeyboardInterrupt


def _progress(done: int, planned: int, run: T.Run, started: float) -> None:
    if run.ok:
        m, w = run.metrics, run.window
        client = run.waits.get("client")
        offered = f" of {m['offered']:.0f}" if "offered" in m else ""
        tail = (f"p50 {m['p50_ms']:6.3f} p99 {m['p99_ms']:6.3f} ms" if "p99_ms" in m
                else f"NOT SUSTAINED ({m.get('achieved_ratio', float('nan')):.2f}x offered)")
        what = (f"{m['rate']:8.0f}{offered}/s {tail}, cwait "
                f"{client.wait_pct if client else float('nan'):4.1f} %, {w.describe() if w else ''}"
                + (" NOISY" if run.noisy else "") + (" (repeated)" if run.retried else ""))
    else:
        what = f"ERROR {run.error}"
    print(f"[{done:>3}/{planned} {time.monotonic() - started:5.0f}s] {run.step:<12} {run.arm:<12} {what}", flush=True)
    scx = run.notes.get("scx")
    if scx:  # scx_layered's view of this run as it comes (the table at the end has the medians)
        print("      scx_layered: " + "; ".join(
            f"{name or 'system'} {_util(values)}" for name, values in sorted(scx.items())), flush=True)


def _util(values: dict) -> str:
    util = values.get("util")
    text = f"{util:.0f}%" if isinstance(util, (int, float)) else "-"
    if values.get("lo_fb_util") is not None:
        text += f" (low fallback {values['lo_fb_util']:.0f}%)"
    if values.get("cpus") not in (None, "", "-"):
        text += f" on {values['cpus']}"
    return text


if __name__ == "__main__":
    sys.exit(main())
