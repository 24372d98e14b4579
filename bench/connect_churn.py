"""PostgreSQL under connection churn (pgbench -C: a new backend process per transaction), with
temperd and without it.

One throwaway cluster (tests/servers.py's, loopback only) serves two pgbench streams at once, both
-C and over the Unix socket (a TCP connection per transaction would leave each port in TIME_WAIT):

- the fast stream, `pgbench -C -S -n -c CLIENTS -j CLIENTS -T SECONDS`, unthrottled: the host's
  maximum rate of new backends; each lives a few ms, so most end before any daemon could act;
- the slow stream, one client whose transactions are `SELECT pg_sleep(0.2)` in a database of its
  own, `connect_churn_slow`: each of its backends lives about 200 ms, long enough to see when it
  was treated.

A sampler thread of this process (bounded by the run's end) polls the postmaster's children every
--poll-ms: a new child's title is read until it is no longer the postmaster's (the time it is first
seen retitled is the title change, late by at most one poll), and from then on each poll reads the
backend's policy, nice and CPU affinity until they are what temperd's plan gives the builtin
profile's `backends` group (read from the running daemon's plan before the window), or until the
backend ends. A slow backend's latency is (first poll that saw it treated) - (first poll that saw
its title), so it has the poll's resolution either way. The sampler runs in both arms, so its own
cost is in both arms' tps.

Arms, interleaved and their order reversed every other round: `stock` (no temperd) and `temperd`
(builtin profiles, native backend, started before the run's warm-up and stopped after it). Reported
per run: the fast stream's tps, connections a second, temperd's CPU (utime + stime from /proc over
the window) as % of a core and per new backend (both streams' connections), its replans and
process events (its status), the slow backends treated within 100 ms of their title change,
their latency, the fast backends seen treated before they ended, and the host's idle, steal and
foreign CPU in the window. Goals: tps with temperd >= 0.95x stock's, temperd <= 10 % of a core,
every slow backend treated within 100 ms.

    sudo .venv/bin/python bench/connect_churn.py [--rounds 2] [--seconds 20] [--clients 2] [--poll-ms 5]
        [--tree DIR] [--json FILE]
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from typing import Dict, List, Optional, Sequence

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (HostMonitor, NoiseLimits, host_description, median, running_temperd,  # noqa: E402
                    tree_command, wait_for_quiet)
from interleaved import (arguments, arm_order, daemon_counts, grown, needs_root, num, quieter_of_two,  # noqa: E402
                         ratio_verdict, report)
import servers as S  # noqa: E402  (tests/servers.py: real servers on loopback; common puts tests/ on sys.path)

from temperd.control import client  # noqa: E402
from temperd.control.protocol import DaemonUnavailable  # noqa: E402

SLOW_DB = "connect_churn_slow"
SLOW_SQL = "SELECT pg_sleep(0.2);\n"
GROUP = "backends"  # the builtin postgresql profile's group of client backends
WITHIN_MS = 100.0
POLICIES = {"other": os.SCHED_OTHER, "batch": os.SCHED_BATCH, "idle": os.SCHED_IDLE}
TPS_GOAL, CPU_GOAL_PCT = 0.95, 10.0


# ---- pgbench's report (pure) --------------------------------------------------------------------


def parse_pgbench_report(text: str) -> Dict[str, float]:
    """pgbench's closing report: transactions processed and failed, tps, and the latency and
    connection-time averages where it prints them (-C prints "average connection time")."""
    found: Dict[str, float] = {}
    patterns = {
        "transactions": r"^number of transactions actually processed: (\d+)",
        "failed": r"^number of failed transactions: (\d+)",
        "latency_avg_ms": r"^latency average = ([\d.]+) ms",
        "connection_avg_ms": r"^average connection time = ([\d.]+) ms",
        "tps": r"^tps = ([\d.]+)",
        "duration_s": r"^duration: (\d+) s",
    }
    for key, pattern in patterns.items():
        match = re.search(pattern, text, re.M)
        if match:
            found[key] = float(match.group(1))
    if "tps" not in found or "transactions" not in found:
        raise ValueError(f"unexpected pgbench output: {text.strip()[-300:]!r}")
    found.setdefault("failed", 0.0)
    return found


# ---- what a backend should get, and the sampler -----------------------------------------------


@dataclass(frozen=True)
class Treatment:
    """The policy and nice that temperd's plan gives a group (nice None: the plan sets none). Not
    the CPUs: the builtin `backends` group is exclusive, and the plan gives it a CPU of its own
    while its live backends fit there and demotes it to the shared CPUs (same nice) when more are
    live, so under churn its affinity flips with each plan while its nice and policy stay."""

    policy: int
    nice: Optional[int]

    def holds(self, policy: int, nice: int, cpus: frozenset = frozenset()) -> bool:
        return policy == self.policy and (self.nice is None or nice == self.nice)


def treatment_from_plan(plan: dict, group: str = GROUP) -> Optional[Treatment]:
    """The first layer of `group` in a plan (the daemon's `plan` reply's "plan"), as a Treatment."""
    for layer in (plan or {}).get("layers", ()):
        if layer.get("group") == group:
            return Treatment(POLICIES.get(layer.get("policy", "other"), os.SCHED_OTHER), layer.get("nice"))
    return None


def task_state(pid: int):
    """(policy, nice, affinity) of a task, or None where it is gone."""
    try:
        return os.sched_getscheduler(pid), os.getpriority(os.PRIO_PROCESS, pid), frozenset(os.sched_getaffinity(pid))
    except OSError:
        return None


@dataclass
class Backend:
    pid: int
    first_seen: float  # monotonic s: the poll that first saw it as a child of the postmaster
    title_at: Optional[float] = None  # the poll that first saw its own title
    slow: bool = False
    treated_at: Optional[float] = None
    ended_at: Optional[float] = None

    def latency_ms(self) -> Optional[float]:
        if self.title_at is None or self.treated_at is None:
            return None
        return 1000.0 * (self.treated_at - self.title_at)


class Sampler(threading.Thread):
    """Polls the postmaster's children until `until` (monotonic); see the module's docstring."""

    def __init__(self, postmaster: int, expected: Optional[Treatment], poll_s: float, until: float):
        super().__init__(name="connect-churn-sampler", daemon=True)
        self.postmaster, self.expected, self.poll_s, self.until = postmaster, expected, poll_s, until
        self.own_title = S.process_title(postmaster)
        self.backends: Dict[int, Backend] = {}
        self.polls = 0
        self.cpu_s = 0.0

    def run(self) -> None:
        live: Dict[int, Backend] = {}
        cpu0 = time.thread_time()
        while True:
            now = time.monotonic()
            if now >= self.until:
                break
            self.polls += 1
            children = set(S.child_pids(self.postmaster))
            for pid in children.difference(live):
                if pid not in self.backends:
                    live[pid] = self.backends[pid] = Backend(pid, now)
            for pid, backend in list(live.items()):
                if pid not in children:
                    backend.ended_at = now
                    del live[pid]
                    continue
                if backend.title_at is None:
                    title = S.process_title(pid)
                    if not title or title == self.own_title:
                        continue  # gone meanwhile, or not retitled yet
                    if "[local]" not in title:  # both streams connect over the Unix socket
                        del live[pid]  # a background process of the server, not a client backend
                        del self.backends[pid]
                        continue
                    backend.title_at, backend.slow = now, f" {SLOW_DB} " in title
                if self.expected is None:
                    task_state(pid)  # the same reads as the temperd arm's, so both arms pay for them
                    continue
                state = task_state(pid)
                if state is not None and self.expected.holds(*state):
                    backend.treated_at = now
                    del live[pid]
            time.sleep(max(0.0, now + self.poll_s - time.monotonic()))
        self.cpu_s = time.thread_time() - cpu0


def judged(backend: Backend, within_ms: float = WITHIN_MS) -> bool:
    """Whether the goal applies to a backend: its title was seen and it was treated, or it lived
    more than `within_ms` after its title (one that ended untreated before then had no chance)."""
    if backend.title_at is None:
        return False
    if backend.treated_at is not None or backend.ended_at is None:
        return True
    return 1000.0 * (backend.ended_at - backend.title_at) > within_ms


def summarize_backends(backends: Sequence[Backend], within_ms: float = WITHIN_MS) -> Dict[str, object]:
    """What the sampler saw, for the slow stream's backends and the fast one's: titles seen, backends
    the goal applies to (judged), those treated within `within_ms`, the slow ones' latency quantiles."""
    out: Dict[str, object] = {"children_seen": len(backends)}
    for kind in ("slow", "fast"):
        titled = [b for b in backends if b.slow == (kind == "slow") and b.title_at is not None]
        latencies = sorted(ms for ms in (b.latency_ms() for b in titled) if ms is not None)
        out[f"{kind}_titled"] = len(titled)
        out[f"{kind}_treated"] = len(latencies)
        out[f"{kind}_judged"] = sum(1 for b in titled if judged(b, within_ms))
        out[f"{kind}_within"] = sum(1 for ms in latencies if ms <= within_ms)
        if kind == "slow":
            for name, q in (("p50", 0.5), ("p99", 0.99)):
                out[f"slow_{name}_ms"] = (latencies[min(len(latencies) - 1, int(round(q * (len(latencies) - 1))))]
                                          if latencies else None)
            out["slow_max_ms"] = latencies[-1] if latencies else None
    return out


# ---- a run ---------------------------------------------------------------------------------------


def pgbench_argv(server, clients: int, seconds: int, script: Optional[str] = None) -> List[str]:
    argv = [S.require("pgbench", "postgresql-client"), "-h", server.extra["socket_dir"], "-p", str(server.port),
            "-U", "postgres", "-C", "-n", "-T", str(seconds)]
    if script is None:
        return argv + ["-S", "-c", str(clients), "-j", str(clients), "postgres"]
    return argv + ["-f", script, "-c", "1", "-j", "1", SLOW_DB]


def make_slow_db(server) -> None:
    psql = S.require("psql", "postgresql-client")
    out = subprocess.run([psql, "-h", server.extra["socket_dir"], "-p", str(server.port), "-U", "postgres", "-d",
                          "postgres", "-qc", f"CREATE DATABASE {SLOW_DB}"], capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise SystemExit(f"could not create {SLOW_DB}: {out.stderr.strip()[-300:]}")


def daemon_treatment(daemon) -> Optional[Treatment]:
    try:
        reply = client.request(daemon.socket, "plan", timeout=30)
    except DaemonUnavailable:
        return None
    return treatment_from_plan(reply.get("plan") or {}) if reply.get("ok") else None


def one_run(server, arm: str, round_no: int, args, script: str, tree: Optional[str]) -> Dict[str, object]:
    def once(quiet: str) -> Dict[str, object]:
        if arm == "stock":
            return measure(server, arm, round_no, args, script, None, quiet)
        with running_temperd(command=tree_command(tree)) as daemon:
            return measure(server, arm, round_no, args, script, daemon, quiet)

    return quieter_of_two(once)


def measure(server, arm: str, round_no: int, args, script: str, daemon, quiet_before: str) -> Dict[str, object]:
    """Warm-up (the slow stream alone, while temperd's first scan settles and its plan shows the
    backends group), then the window: both streams for --seconds."""
    hz = os.sysconf("SC_CLK_TCK")
    warm = subprocess.Popen(pgbench_argv(server, 1, 3, script), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    expected = None
    deadline = time.monotonic() + 3.0
    while daemon is not None and expected is None and time.monotonic() < deadline:
        time.sleep(0.5)
        expected = daemon_treatment(daemon)
    warm.wait(timeout=30)
    postmaster = task_state(server.pid)
    seconds = int(args.seconds)
    counts0 = daemon_counts(daemon)
    monitor = HostMonitor(also_ours=[server.pid])
    monitor.start()
    sampler = Sampler(server.pid, expected, args.poll_ms / 1000.0, time.monotonic() + seconds + 2.0)
    sampler.start()
    ticks0, t0 = (daemon.cpu_ticks() if daemon else 0), time.monotonic()
    with tempfile.TemporaryFile("w+") as fast_out, tempfile.TemporaryFile("w+") as slow_out:
        fast = subprocess.Popen(pgbench_argv(server, args.clients, seconds), stdout=fast_out, stderr=subprocess.STDOUT)
        slow = subprocess.Popen(pgbench_argv(server, 1, seconds, script), stdout=slow_out, stderr=subprocess.STDOUT)
        for proc in (fast, slow):
            try:
                proc.wait(timeout=seconds + 30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        wall = time.monotonic() - t0
        ticks1 = daemon.cpu_ticks() if daemon else 0
        window = monitor.stop()
        sampler.join(timeout=10)
        fast_out.seek(0)
        slow_out.seek(0)
        fast_report, slow_report = parse_pgbench_report(fast_out.read()), parse_pgbench_report(slow_out.read())
    counts1 = daemon_counts(daemon)
    connections = fast_report["transactions"] + slow_report["transactions"]
    cpu_s = (ticks1 - ticks0) / hz
    counts = grown(counts0, counts1)
    return {
        "round": round_no, "arm": arm, "wall_s": wall, "tps": fast_report["tps"],
        "fast_transactions": fast_report["transactions"], "failed": fast_report["failed"] + slow_report["failed"],
        "connection_avg_ms": fast_report.get("connection_avg_ms"),
        "slow_transactions": slow_report["transactions"], "connections_per_s": connections / wall,
        "daemon_cpu_s": cpu_s if daemon else None,
        "daemon_cpu_pct_of_core": 100.0 * cpu_s / wall if daemon else None,
        "daemon_cpu_us_per_backend": 1e6 * cpu_s / connections if daemon and connections else None,
        "replans": counts["replans"], "events": counts["events"],
        "expected": None if expected is None else asdict(expected),
        # a backend is forked with the postmaster's policy and nice: where the group's are the same,
        # "treated" cannot be told from "inherited"
        "postmaster": None if postmaster is None else {"policy": postmaster[0], "nice": postmaster[1]},
        "distinguishable": None if expected is None or postmaster is None else not expected.holds(*postmaster),
        "quiet_before": quiet_before,
        "sampler_polls": sampler.polls, "sampler_cpu_pct_of_core": 100.0 * sampler.cpu_s / wall,
        **summarize_backends(list(sampler.backends.values())),
        "host_idle_pct": window.idle_pct, "host_steal_pct": window.steal_pct,
        "foreign_cpu_pct_of_core": window.foreign_core_pct, "foreign_top": window.foreign_top,
        "noisy": window.noisy(NoiseLimits()),
    }


# ---- the report (pure) --------------------------------------------------------------------------


def table(runs: Sequence[Dict[str, object]]) -> str:
    """One Markdown row per run."""
    lines = ["| round | arm | tps | new backends/s | temperd % of a core | temperd CPU per backend | replans/s | "
             "slow backends treated <= 100 ms | slow p50 / p99 / max ms | fast backends treated; of those living "
             "> 100 ms, treated <= 100 ms | "
             "host idle / steal / foreign |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        wall = float(r["wall_s"])  # type: ignore[arg-type]
        within = "-" if r["arm"] == "stock" else f"{r['slow_within']} of {r['slow_judged']}"
        latency = ("-" if r["slow_p50_ms"] is None else
                   f"{r['slow_p50_ms']:.0f} / {r['slow_p99_ms']:.0f} / {r['slow_max_ms']:.0f}")
        fast = ("-" if r["arm"] == "stock" else
                f"{r['fast_treated']} of {r['fast_titled']}; {r['fast_within']} of {r['fast_judged']}")
        lines.append(
            f"| {r['round']} | {r['arm']} | {float(r['tps']):.0f} | {float(r['connections_per_s']):.0f} | "  # type: ignore
            f"{num(r['daemon_cpu_pct_of_core'], '.1f')} | "
            f"{num(r['daemon_cpu_us_per_backend'], '.0f')}{'' if r['daemon_cpu_us_per_backend'] is None else ' µs'} | "
            f"{'-' if r['replans'] is None else format(float(r['replans']) / wall, '.1f')} | {within} | {latency} | "  # type: ignore
            f"{fast} | {float(r['host_idle_pct']):.0f} / {float(r['host_steal_pct']):.1f} / "  # type: ignore
            f"{float(r['foreign_cpu_pct_of_core']):.0f} % |")  # type: ignore
    return "\n".join(lines)


def verdicts(runs: Sequence[Dict[str, object]]) -> List[str]:
    """The three goals over the runs: tps ratio per round and its median, temperd's CPU, latency."""
    by_round: Dict[int, Dict[str, Dict[str, object]]] = {}
    for r in runs:
        by_round.setdefault(int(r["round"]), {})[str(r["arm"])] = r  # type: ignore[arg-type]
    ratios = [float(p["temperd"]["tps"]) / float(p["stock"]["tps"])  # type: ignore[arg-type]
              for p in by_round.values() if "temperd" in p and "stock" in p and float(p["stock"]["tps"]) > 0]  # type: ignore
    ours = [r for r in runs if r["arm"] == "temperd"]
    cpu = [float(r["daemon_cpu_pct_of_core"]) for r in ours if r["daemon_cpu_pct_of_core"] is not None]  # type: ignore
    titled = sum(int(r[f"{kind}_judged"]) for r in ours for kind in ("slow", "fast"))  # type: ignore[arg-type]
    within = sum(int(r[f"{kind}_within"]) for r in ours for kind in ("slow", "fast"))  # type: ignore[arg-type]
    out = []
    if ratios:
        out.append(ratio_verdict("tps", TPS_GOAL, ratios))
    if cpu:
        out.append(f"temperd <= {CPU_GOAL_PCT:g} % of a core: {'PASS' if max(cpu) <= CPU_GOAL_PCT else 'MISS'} "
                   f"(median {median(cpu):.1f} %, max {max(cpu):.1f} %)")
    if any(r["distinguishable"] is False for r in ours):
        out.append("treated or inherited: the backends group's policy and nice are the postmaster's, so the "
                   "sampler cannot tell a treated backend from an untreated one")
    elif titled:
        out.append(f"every backend that lived {WITHIN_MS:.0f} ms past its title change treated within them: "
                   f"{'PASS' if within == titled else 'MISS'} ({within} of {titled})")
    return out


def main() -> int:
    parser = arguments(__doc__)
    parser.add_argument("--seconds", type=int, default=20, help="each run's window")
    parser.add_argument("--clients", type=int, default=2, help="the fast stream's clients (and threads)")
    parser.add_argument("--poll-ms", type=float, default=5.0, help="the sampler's interval")
    args = parser.parse_args()
    if needs_root():
        return 2
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    quiet = wait_for_quiet(60.0)
    print(host_description())
    print(f"started {started}; before the first run: {quiet.describe()}")
    runs: List[Dict[str, object]] = []
    with S.postgresql_server() as server, tempfile.TemporaryDirectory() as scratch:
        make_slow_db(server)
        script = os.path.join(scratch, "slow.sql")
        with open(script, "w") as handle:
            handle.write(SLOW_SQL)
        print(f"{server.version}; fast stream: pgbench -C -S -c {args.clients} -j {args.clients}; slow stream: "
              f"pgbench -C -c 1 -f ({SLOW_SQL.strip()}) on {SLOW_DB}; {args.seconds} s windows; "
              f"temperd from {args.tree or 'this checkout'}")
        for round_no in range(1, args.rounds + 1):
            for arm in arm_order(round_no):
                run = one_run(server, arm, round_no, args, script, args.tree)
                runs.append(run)
                print(f"round {round_no} {arm}: tps {run['tps']:.0f}, temperd "
                      f"{num(run['daemon_cpu_pct_of_core'], '.1f')} % of a core, expected {run['expected']}", flush=True)
    report(runs, table, verdicts, args.json, started=started, quiet_before=asdict(quiet), tree=args.tree or ".")
    return 0


if __name__ == "__main__":
    sys.exit(main())
