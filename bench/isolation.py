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
from dataclasses import asdict
from typing import Dict, List, Optional, Sequence, Tuple

import arms as A  # bench/arms.py
import common as C  # bench/common.py; also puts the checkout and tests/ on sys.path
import workloads as W  # bench/workloads.py

import servers as S  # noqa: E402  (tests/servers.py)
from temperd.backends.native.autogroup import read_autogroup  # noqa: E402
from temperd.backends.native.sched import POLICY_NAMES  # noqa: E402
from temperd.sources import procfs  # noqa: E402
from temperd.training import trials as T  # noqa: E402


# ---- steps ----------------------------------------------------------------------------------------------


def step_name(variant: str, bg: int) -> str:
    return f"{variant} bg={bg}"


def parse_step(name: str) -> Tuple[str, int]:
    variant, _, bg = name.rpartition(" bg=")
    return variant, int(bg)


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


# ---- tables ----------------------------------------------------------------------------------------------


def wait_pct(runs: Sequence[T.Run], label: str, attr: str = "wait_pct") -> float:
    return T.median(getattr(r.waits[label], attr) for r in runs if label in r.waits)


def window_median(runs: Sequence[T.Run], attr: str) -> float:
    values = (getattr(r.window, attr) for r in runs if r.window is not None)
    return T.median(float("nan") if v is None else v for v in values)  # None: not counted (older JSON)


def groups_of(runs: Sequence[T.Run]) -> Dict[Tuple[str, str], List[T.Run]]:
    out: Dict[Tuple[str, str], List[T.Run]] = {}
    for run in runs:
        out.setdefault((run.step, run.arm), []).append(run)
    return out


def mark(comparison: T.Comparison) -> str:
    """The ratio, starred where the difference stands out of the runs' spread."""
    return f"{comparison.ratio:5.2f}{'' if comparison.verdict == T.WITHIN_NOISE else '*'}"


def by_hand_ratio(work: Dict[Tuple[str, str], T.Spread], step: str, arm: str) -> str:
    """The work done (the spinners', the neighbour's) under an arm over the same by hand ("-" without it)."""
    mine, hand = work.get((step, arm)), work.get((step, A.BY_HAND))
    if mine is None or hand is None or not hand.median or hand.median != hand.median:
        return "-"
    return f"{mine.median / hand.median:.2f}"


def print_table(workload: W.Workload, variant: str, ladder: Sequence[int], arm_names: Sequence[str],
                runs: Sequence[T.Run], amount: int) -> None:
    groups = groups_of(runs)
    rate = T.summarise(runs, "rate")
    p50 = T.summarise(runs, "p50_ms")
    p99 = T.summarise(runs, "p99_ms")
    bg_ops = T.summarise(runs, "bg_ops_s")
    neighbour = _measured(runs, "neighbour_ops_s")
    print()
    print(f"{workload.name}, {workload.describe(variant, amount)}; medians over the runs "
          f"(p99 range in brackets; * = ranges apart and >= 5 % apart, 2+ runs each)")
    head = (f"{'bg':>3} {'arm':<16} {workload.rate_unit:>9} {'p50 ms':>7} {'p99 ms (range)':>22} "
            f"{'r/st':>6} {'p99/st':>6} {'r/hand':>6} {'p99/hd':>6} {'cwait%':>6} {'cdly%':>6} {'swait%':>6} "
            f"{'runs':>4} {'noisy':>5} {'idle%':>5} {'bg ops/s':>9} {'bg/hd':>5} "
            + (f"{'nb ops/s':>9} {'nb/hd':>5} " if neighbour else "")
            + f"{'steal%':>6} {'frgn%':>5} {'IPI/s':>6}  client ran on (allowed); server ran on; spinners ran on"
            + ("; neighbour ran on" if neighbour else ""))
    print(head)
    print("-" * len(head))
    for bg in ladder:
        step = step_name(variant, bg)
        for arm in arm_names:
            group = [r for r in groups.get((step, arm), []) if r.ok]
            if (step, arm) not in rate:
                for r in groups.get((step, arm), []):
                    print(f"{bg:>3} {arm:<16} error: {r.error}")
                continue
            ratios = []
            for base in (A.STOCK, A.BY_HAND):
                if (step, base) in rate:
                    ratios.append(mark(T.compare(rate[step, arm], rate[step, base], higher_is_better=True)))
                    ratios.append(mark(T.compare(p99[step, arm], p99[step, base], higher_is_better=False)))
                else:
                    ratios += ["    -", "    -"]
            q = p99[step, arm]
            last = group[-1].notes
            print(f"{bg:>3} {arm:<16} {rate[step, arm].median:9.0f} {p50[step, arm].median:7.3f} "
                  f"{q.median:7.3f} ({q.low:6.3f}-{q.high:6.3f}) {' '.join(f'{x:>6}' for x in ratios)} "
                  f"{wait_pct(group, 'client'):6.1f} {wait_pct(group, 'client', 'delay_pct'):6.1f} "
                  f"{wait_pct(group, 'server'):6.1f} {len(group):>4} {sum(r.noisy for r in group):>5} "
                  f"{window_median(group, 'idle_pct'):5.1f} {bg_ops[step, arm].median:9.0f} "
                  f"{by_hand_ratio(bg_ops, step, arm):>5} "
                  + (f"{_median_of(neighbour, step, arm):9.0f} {by_hand_ratio(neighbour, step, arm):>5} " if neighbour else "")
                  + f"{window_median(group, 'steal_pct'):6.1f} "
                  f"{window_median(group, 'foreign_core_pct'):5.1f} {window_median(group, 'resched_per_s'):6.0f}  "
                  f"{last.get('client_cpus', '-')} ({last.get('client_allowed', '-')}); {last.get('server_cpus', '-')}; "
                  f"{last.get('spinner_cpus', '-')}" + (f"; {last.get('neighbour_cpus', '-')}" if neighbour else ""))


def markdown_table(workload_name: str, rate_unit: str, variant: str, ladder: Sequence[int],
                   arm_names: Sequence[str], runs: Sequence[T.Run]) -> str:
    """The table docs/benchmarks.md shows: medians, p99 range, ratios to stock and by-hand (a * marks
    a difference that stands out of the runs' spread), runqueue waits and the host's noise."""
    groups = groups_of(runs)
    rate, p50, p99, bg_ops = (T.summarise(runs, m) for m in ("rate", "p50_ms", "p99_ms", "bg_ops_s"))
    neighbour = _measured(runs, "neighbour_ops_s")
    lines = [f"| bg | arm | {rate_unit} | p50 ms | p99 ms (range) | {rate_unit} ÷ stock | p99 ÷ stock | "
             f"{rate_unit} ÷ by-hand | p99 ÷ by-hand | client wait % | server wait % | runs (noisy) | "
             "idle % | background bogo-ops/s | background ÷ by-hand | "
             + ("neighbour bogo-ops/s | neighbour ÷ by-hand | " if neighbour else "")
             + "steal % | foreign % of a core | resched IPIs/s |",
             "|" + "---|" * (20 if neighbour else 18)]
    for bg in ladder:
        step = step_name(variant, bg)
        for arm in arm_names:
            if (step, arm) not in rate:
                continue
            group = [r for r in groups[step, arm] if r.ok]
            ratios = []
            for base in (A.STOCK, A.BY_HAND):
                if (step, base) in rate:
                    ratios.append(mark(T.compare(rate[step, arm], rate[step, base], True)).strip())
                    ratios.append(mark(T.compare(p99[step, arm], p99[step, base], False)).strip())
                else:
                    ratios += ["-", "-"]
            q = p99[step, arm]
            lines.append(f"| {bg} | {arm} | {rate[step, arm].median:,.0f} | {p50[step, arm].median:.3f} | "
                         f"{q.median:.3f} ({q.low:.3f}–{q.high:.3f}) | {' | '.join(ratios)} | "
                         f"{wait_pct(group, 'client'):.1f} | {wait_pct(group, 'server'):.1f} | "
                         f"{len(group)} ({sum(r.noisy for r in group)}) | {window_median(group, 'idle_pct'):.0f} | "
                         f"{bg_ops[step, arm].median:,.0f} | {by_hand_ratio(bg_ops, step, arm)} | "
                         + (f"{_median_of(neighbour, step, arm):,.0f} | {by_hand_ratio(neighbour, step, arm)} | "
                            if neighbour else "")
                         + f"{window_median(group, 'steal_pct'):.1f} | {window_median(group, 'foreign_core_pct'):.1f} | "
                         f"{_count(window_median(group, 'resched_per_s'))} |")
    return "\n".join(lines).replace(",", " ")


def _count(value: float) -> str:
    return "-" if value != value else f"{value:,.0f}"  # NaN: not counted


def _measured(runs: Sequence[T.Run], metric: str) -> Dict[Tuple[str, str], T.Spread]:
    """T.summarise of a metric only some benchmarks measure (--neighbour); empty where no run has it."""
    return T.summarise(runs, metric) if any(metric in r.metrics for r in runs) else {}


def _median_of(table: Dict[Tuple[str, str], T.Spread], step: str, arm: str) -> float:
    found = table.get((step, arm))
    return found.median if found is not None else float("nan")


def runs_from_json(path: str) -> Tuple[dict, List[T.Run]]:
    with open(path) as handle:
        data = json.load(handle)
    runs = []
    for raw in data["runs"]:
        window = T.HostWindow(**raw["window"]) if raw.get("window") else None
        waits = {k: T.RunqueueWait(v["wait_s"], v["run_s"], v["seconds"]) for k, v in raw.get("waits", {}).items()}
        runs.append(T.Run(raw["step"], raw["arm"], raw["rep"], raw["metrics"], window, waits, raw["notes"],
                          raw["noisy"], raw["retried"], raw["error"]))
    return data, runs


STRONG_AT_TOP = ("redis c=50", "memcached", "postgresql")  # p99 >= 3x better than stock at the top step


def goals(variant: str, ladder: Sequence[int], runs: Sequence[T.Run], arm: str,
          workload_name: str = "") -> List[Tuple[str, Optional[bool], str]]:
    """The goals for one temperd arm: (text, verdict or None when not measurable, numbers).
    - p99 <= 1.1x by-hand at every step, throughput >= 0.95x by-hand;
    - at 0 and 1 spinners: p99 <= 1.1x stock and throughput >= 0.95x stock;
    - at the top step: host idle <= 5 % and background work >= 0.9x by-hand's, and (redis c=50,
      memcached, PostgreSQL) p99 at least 3x better than stock;
    - with an untagged neighbour (--neighbour): its work >= 0.9x what it does by hand, every step."""
    rate, p99, bg_ops = (T.summarise(runs, m) for m in ("rate", "p99_ms", "bg_ops_s"))
    neighbour = _measured(runs, "neighbour_ops_s")
    groups = groups_of(runs)
    out: List[Tuple[str, Optional[bool], str]] = []
    have = [bg for bg in ladder if (step_name(variant, bg), arm) in p99]
    top = max(ladder)

    def at(table, bg, who=arm):
        return table.get((step_name(variant, bg), who))

    hand = [bg for bg in have if at(p99, bg, A.BY_HAND)]
    if hand:
        ratios = [(bg, at(p99, bg).median / at(p99, bg, A.BY_HAND).median,
                   at(rate, bg).median / at(rate, bg, A.BY_HAND).median) for bg in hand]
        out.append(("p99 <= 1.1x by-hand and throughput >= 0.95x by-hand at every step",
                    all(p <= 1.1 and r >= 0.95 for _, p, r in ratios),
                    ", ".join(f"bg={bg} p99 {p:.2f}x, thr {r:.2f}x" for bg, p, r in ratios)))
    beside = [bg for bg in have if at(neighbour, bg) and at(neighbour, bg, A.BY_HAND)]
    if beside:
        shares = [(bg, at(neighbour, bg).median / at(neighbour, bg, A.BY_HAND).median) for bg in beside]
        out.append(("the untagged neighbour's work >= 0.9x by-hand's at every step", all(x >= 0.9 for _, x in shares),
                    ", ".join(f"bg={bg} {x:.2f}x" for bg, x in shares)))
    for bg in (0, 1):
        if bg in have and at(p99, bg, A.STOCK):
            r99 = at(p99, bg).median / at(p99, bg, A.STOCK).median
            rr = at(rate, bg).median / at(rate, bg, A.STOCK).median
            out.append((f"bg={bg}: p99 <= 1.1x stock and throughput >= 0.95x stock", r99 <= 1.1 and rr >= 0.95,
                        f"p99 {r99:.2f}x, throughput {rr:.3f}x"))
    if top in have and top > 0:
        mine = [r for r in groups.get((step_name(variant, top), arm), []) if r.ok]
        idle = window_median(mine, "idle_pct")
        out.append((f"bg={top}: host idle <= 5 %", idle <= 5.0, f"{idle:.1f} %"))
        if at(bg_ops, top, A.BY_HAND) and at(bg_ops, top, A.BY_HAND).median:
            share = at(bg_ops, top).median / at(bg_ops, top, A.BY_HAND).median
            out.append((f"bg={top}: background work >= 0.9x by-hand's", share >= 0.9,
                        f"{at(bg_ops, top).median:,.0f} / {at(bg_ops, top, A.BY_HAND).median:,.0f} bogo-ops/s = {share:.2f}x"))
        if at(p99, top, A.STOCK) and (workload_name in STRONG_AT_TOP or f"{workload_name} {variant}" in STRONG_AT_TOP):
            gain = at(p99, top, A.STOCK).median / at(p99, top).median
            out.append((f"bg={top}: p99 at least 3x better than stock", gain >= 3.0,
                        f"stock {at(p99, top, A.STOCK).median:.3f} ms / {at(p99, top).median:.3f} ms = {gain:.2f}x"))
    return out


def print_scx(runs: Sequence[T.Run]) -> None:
    """What scx_layered reported about each layer over the scx arms' runs (medians)."""
    groups: Dict[Tuple[str, str], List[T.Run]] = {}
    for run in runs:
        if run.notes.get("scx"):
            groups.setdefault((run.step, run.arm), []).append(run)
    if not groups:
        return
    print("\nWhat scx_layered reported over each run (its stats socket: deltas over the run), medians; "
          "util: % of one CPU; prot: share of util on the layer's protected CPUs:")
    print(f"{'step':<14} {'arm':<7} {'layer':<44} {'tasks':>5} {'cpus':>4} {'util%':>6} {'prot':>5} {'affn_viol':>9}  cpu mask")
    for (step, arm), group in sorted(groups.items()):
        stats = [r.notes["scx"] for r in group]
        system = [s.get("", {}) for s in stats]
        print(f"{step:<14} {arm:<7} {'(system: busy % of all CPUs / util)':<44} {'':>5} {'':>4} "
              f"{_med(system, 'util'):6.0f} {'':>5} {_med(system, 'affn_viol'):9.0f}  busy {_med(system, 'busy'):.0f} %, "
              f"low fallback {_med(system, 'lo_fb_util'):.0f} % of a CPU")
        for name in sorted({n for s in stats for n in s if n}):
            rows = [s[name] for s in stats if name in s]
            print(f"{'':<14} {'':<7} {name[:44]:<44} {_med(rows, 'tasks'):5.0f} {_med(rows, 'cur_nr_cpus'):4.0f} "
                  f"{_med(rows, 'util'):6.1f} {_med(rows, 'util_protected_frac'):5.2f} {_med(rows, 'affn_viol'):9.0f}  "
                  f"{rows[-1].get('cpus', '-')}")


def _med(rows: Sequence[dict], key: str) -> float:
    return T.median(float(r[key]) for r in rows if isinstance(r.get(key), (int, float)))


def run_json(run: T.Run) -> dict:
    out = asdict(run)
    for label, wait in run.waits.items():
        out["waits"][label].update(wait_pct=wait.wait_pct, delay_pct=wait.delay_pct)
    return out


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
            print(markdown_table(workload.name, workload.rate_unit, variant, [int(x) for x in args.ladder.split(",")],
                                 list(data["arms"]), runs))
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
        for arm in arm_names:
            if arm in (A.STOCK, A.BY_HAND):
                continue
            print(f"\nGoals, {workload.name} {variant}, arm {arm}:")
            for text, ok, numbers in goals(variant, ladder, runs, arm, workload.name):
                print(f"  {'n/a ' if ok is None else ('PASS' if ok else 'MISS')}  {text}: {numbers}")
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
