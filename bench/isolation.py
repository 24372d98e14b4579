"""Isolation: a server from its Debian or PyPI package under its standard load generator while
CPU spinners crowd the host, under several arms: the stock scheduler, what an operator does by
hand, and temperd.

Usage (root, from the checkout):
  .venv/bin/python bench/isolation.py                     # redis, all default arms, about 15 minutes
  .venv/bin/python bench/isolation.py --quick             # smoke run: 1 repetition, bg 0 and 4
  .venv/bin/python bench/isolation.py --server memcached  # see --help for the servers
  options: --reps N --ladder 0,1,2,4 --variants c=50,c=1 --arms stock,by-hand,temperd,temperd+bg
           --seconds S --run-timeout S --trained-profile FILE --train SECONDS --profile-arm NAME=FILE --json FILE
  e.g. the trained profile against stock and the builtin (temperctl train under the first variant's
  load for 20 s first, the profile kept beside --json):
  .venv/bin/python bench/isolation.py --train 20 --arms stock,temperd+bg,trained --ladder 0,4 --reps 5
  and a hand-edited variant of a trained profile beside it, in the same interleaved runs:
  .venv/bin/python bench/isolation.py --server jvm --trained-profile jvm.toml --profile-arm edited=jvm-edited.toml
  an untagged CPU-busy service beside the server (2 stress-ng workers, standard tier) in every run:
  .venv/bin/python bench/isolation.py --neighbour 2 --arms stock,by-hand,temperd+bg

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
- Per run (temperd.training.trials): the host's idle and steal share and the CPU of processes
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
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional, Sequence

import arms as A  # bench/arms.py
import common as C  # bench/common.py; also puts the checkout and tests/ on sys.path
import workloads as W  # bench/workloads.py
from isolation_report import (markdown_table, parse_step, print_goals, print_scx, print_table, run_json,  # noqa: E402
                              runs_from_json, step_name)

import servers as S  # noqa: E402  (tests/servers.py)
from temperd.backends.native.autogroup import read_autogroup  # noqa: E402
from temperd.backends.native.sched import POLICY_NAMES  # noqa: E402
from temperd.sources import procfs  # noqa: E402
from temperd.training import trials as T  # noqa: E402


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
        proc = subprocess.Popen(workload.load_argv(self.server, variant, self.amounts[variant]),
                                stdout=output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True)
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
                sampler.sample("client", proc.pid)
                sampler.sample("server", server_pids[0])
                for pid in spinners:
                    sampler.sample("spinners", pid)
                for pid in neighbour:
                    sampler.sample("neighbour", pid)
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
        if proc.returncode != 0:
            run.error = f"{workload.tool} exited with {proc.returncode}: {stdout.strip()[-200:]}"
            return
        try:
            m = workload.parse(stdout)
        except ValueError as exc:
            run.error = str(exc)
            return
        run.metrics = {"rate": m.rate, "p50_ms": m.p50_ms, "p99_ms": m.p99_ms}


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", choices=sorted(W.WORKLOADS), default="redis")
    parser.add_argument("--reps", type=int, default=3, help="repetitions per step (default 3)")
    parser.add_argument("--ladder", default="0,1,2,4", help="spinner counts (default 0,1,2,4)")
    parser.add_argument("--variants", help="load variants (default: the workload's, e.g. c=50,c=1 for redis)")
    parser.add_argument("--seconds", type=float, default=2.5, help="length of a stock bg=0 run (default 2.5)")
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
    parser.add_argument("--markdown", metavar="JSON", help="print the Markdown tables of --json files (comma-separated, pooled) and exit")
    args = parser.parse_args()
    if args.markdown:
        data, runs = {}, []
        for path in args.markdown.split(","):  # several runs of one workload are pooled
            data, more = runs_from_json(path)
            runs += more
        workload = W.WORKLOADS[data["workload"]]()
        for variant in data["amounts"]:
            print(f"\n{workload.name} {variant}:\n")
            ladder = [int(x) for x in args.ladder.split(",")]
            print(markdown_table(workload.name, workload.rate_unit, variant, ladder, list(data["arms"]), runs))
            print_goals(workload, variant, ladder, list(data["arms"]), runs)
        return 0
    signal.signal(signal.SIGTERM, _interrupted)  # stop like Ctrl-C: servers stopped, cgroups removed
    if os.geteuid() != 0:
        print("isolation.py: must run as root (temperd changes scheduling settings of other processes)", file=sys.stderr)
        return 2
    own = read_autogroup(os.getpid())
    if own is not None and own[1] != 0:  # the load generator and the spinners run in this session
        print(f"isolation.py: this session's autogroup {own[0]} has nice {own[1]}, which weighs the load generator "
              f"and the spinners against the server; expected 0 (echo 0 > /proc/{os.getpid()}/autogroup)",
              file=sys.stderr)
        return 2
    if args.quick:
        args.reps, args.ladder, args.seconds = 1, "0,4", min(args.seconds, 1.5)
    workload = W.WORKLOADS[args.server]()
    ladder = [int(x) for x in args.ladder.split(",")]
    variants = args.variants.split(",") if args.variants else list(workload.variants)
    arm_names = [a for a in args.arms.split(",") if a]
    if args.train:
        if not args.trained_profile:
            args.trained_profile = f"{os.path.splitext(args.json)[0] if args.json else workload.name}-trained.toml"
        if A.TRAINED not in arm_names:
            arm_names.append(A.TRAINED)
    elif A.TRAINED in arm_names and not args.trained_profile:
        parser.error("the trained arm needs --trained-profile FILE (or --train SECONDS)")
    profile_arms = dict(spec.split("=", 1) for spec in args.profile_arm if "=" in spec)
    if len(profile_arms) != len(args.profile_arm) or set(profile_arms) & set(arm_names) - set(profile_arms):
        parser.error("--profile-arm takes NAME=FILE, NAME a new arm's name")
    arm_names += [name for name in profile_arms if name not in arm_names]
    limits = T.NoiseLimits(args.noisy_foreign, args.noisy_steal)
    started = time.monotonic()
    print(C.host_description())
    print(f"started {time.strftime('%Y-%m-%d %H:%M:%S %Z')}, load average {C.load_average():.2f}")
    print(f"host before the run: {T.wait_for_quiet(60.0, limits).describe()}")
    runs: List[T.Run] = []
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
            amounts = {v: workload.size(server, v, args.seconds, timeout_s) for v in variants}
            if args.train:
                A.train_profile(workload, server, variants[0], args.train, args.trained_profile, timeout_s)
            if args.warm > 0 and workload.exclusive_group:
                group = A.warm_history(workload, server, under, variants[0], args.warm, timeout_s)
                print(f"after {args.warm:g} s under {variants[0]}'s load, temperd plans the {workload.exclusive_group} "
                      f"group: {group}")
            by_hand_cpus = A.planned_cpus(under) if A.BY_HAND in arm_names else frozenset()
            arms = A.make_arms(under, by_hand_cpus)
            unknown = [a for a in arm_names if a not in arms]
            if unknown or A.STOCK not in arm_names:
                parser.error(f"--arms: expected stock plus any of {', '.join(arms)}, found {args.arms!r}")
            bench = Bench(workload, server, under, arms, amounts, timeout_s, A.pmqos_values(),
                          spinners_own_session=args.spinner_session == "own", neighbour=args.neighbour,
                          neighbour_cgroup=neighbour_cgroup)
            print(f"{workload.name} {workload.version(server)} pid {server.pid} in cgroup {server_cgroup.relative}, spinners in "
                  f"{spinner_cgroup.relative} and {'a session of their own' if bench.spinners_own_session else 'this session'}"
                  "; work per run: " + ", ".join(f"{v}: {a}" for v, a in amounts.items()))
            if args.neighbour:
                print(f"an untagged neighbour beside it: {args.neighbour} stress-ng worker(s) in {neighbour_cgroup.relative}, "
                      "a session of their own, standard tier")
            for name in arm_names:
                print(f"  arm {name}: {arms[name].description}")
            if A.BY_HAND in arm_names:
                print(f"  by-hand pins the server to CPU(s) {C.cpulist(by_hand_cpus)} (what temperd gives it)")
            steps = [step_name(v, bg) for v in variants for bg in ladder]
            planned = len(steps) * len(arm_names) * args.reps
            print(f"{planned} runs: {len(steps)} steps x {len(arm_names)} arms x {args.reps} repetitions, interleaved")
            plan = T.TrialPlan(steps, lambda step: arm_names, args.reps, limits, args.max_retries,
                               started + args.max_minutes * 60)

            def progress(run: T.Run) -> None:
                runs.append(run)
                _progress(len(runs), planned, run, started)

            try:
                T.run_trials(plan, bench.run, progress)
            except T.OutOfTime:
                print(f"stopping: --max-minutes {args.max_minutes:g} reached", flush=True)
    except KeyboardInterrupt:
        print("interrupted: results so far", flush=True)
    except S.ServerUnavailable as exc:
        print(f"isolation.py: {exc}", file=sys.stderr)
        return 2
    finally:
        shutil.rmtree(history_dir, ignore_errors=True)
    if not runs:
        print("no runs completed", file=sys.stderr)
        return 1
    for variant in variants:
        print_table(workload, variant, ladder, arm_names, runs, amounts[variant])
    if workload.notes:
        print(f"\nNote: {workload.notes}.")
    print_scx(runs)
    print("\ncwait% / swait%: runqueue wait (schedstat) of the load generator / the server's threads, % of the run;")
    print("cdly%: the load generator's wait as a share of the time it wanted a CPU (run + wait).")
    for variant in variants:
        print_goals(workload, variant, ladder, arm_names, runs)
    retried = sum(r.retried for r in runs)
    print(f"\n{len(runs)} runs in {(time.monotonic() - started) / 60:.1f} min, {retried} repeated as noisy; "
          f"finished {time.strftime('%H:%M:%S')}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"host": C.host_description(), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                       "workload": workload.name, "amounts": amounts, "spinner_session": args.spinner_session,
                       "neighbour": args.neighbour,
                       "arms": {n: arms[n].description for n in arm_names},
                       "runs": [run_json(r) for r in runs]}, handle, indent=1)
    return 0


def _interrupted(signum, frame) -> None:
    raise KeyboardInterrupt


def _progress(done: int, planned: int, run: T.Run, started: float) -> None:
    if run.ok:
        m, w = run.metrics, run.window
        client = run.waits.get("client")
        what = (f"{m['rate']:8.0f}/s p50 {m['p50_ms']:6.3f} p99 {m['p99_ms']:6.3f} ms, cwait "
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
