"""Open-loop load for the isolation bench: requests sent on a schedule, at a rate held equal across
arms, so that an arm's tail is not measured at a higher load than another's (a closed-loop generator
sends as fast as it is answered: the faster arm gets more load, and more queueing in its p99).

The generators, and where each one's latency starts:

- memtier_benchmark (redis, memcached), `--rate-limiting` requests per second per connection: every
  interval (at least 20 ms; `ceil(rate / 50)` requests each) a connection gets a budget of requests
  and sends them at once; a budget not used by the next interval is dropped, not carried over.
  Its latency runs from the moment a request is written, not from an intended send time: it is
  *not* corrected for coordinated omission. Two things bound the omission here: the pipeline is
  deep enough (four intervals' budget) that a request is never held back behind unanswered ones, so
  the write is at the interval's tick; and a send that the server or memtier's own CPU made late
  past the next tick is lost from the budget, so a stall shows as achieved < offered, which is
  reported as "not sustained" instead of a p99. A delay shorter than that is not in the latency.
- `pgbench -R` (PostgreSQL): transactions scheduled by a Poisson process; the per-transaction log's
  latency is measured from the scheduled start (schedule lag included): corrected.
- `sysbench --rate` (MariaDB): events generated at the rate into a queue the threads take from; the
  latency includes the time in the queue: corrected. A queue that overflows ends the run ("The event
  queue is full"): not sustained.

A run whose achieved rate is below SUSTAINED x the offered one did not carry the offered load: it
has no p99 (`OpenMeasurement.sustained`).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import statistics
import subprocess
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

SUSTAINED = 0.95  # achieved / offered below this: the run did not carry the offered load
HERE = os.path.dirname(os.path.abspath(__file__))
# memtier_benchmark's source and build script, beside the checkout (../shared/memtier/), or named by
# TEMPERD_MEMTIER_SRC; the built binary is cached, or named by TEMPERD_MEMTIER / --memtier.
MEMTIER_SRC = os.environ.get("TEMPERD_MEMTIER_SRC") or os.path.join(os.path.dirname(os.path.dirname(HERE)),
                                                                    "shared", "memtier")
MEMTIER_INTERVALS_IN_FLIGHT = 4  # the pipeline holds this many intervals' budget


# Where each generator's latency starts (the module's text says why), for the bench's output and JSON.
LATENCY_FROM = {
    "memtier_benchmark": "memtier_benchmark's latency runs from a request's write, not from its intended send time: "
                         "not corrected for coordinated omission; a stall that costs sends shows as achieved < offered",
    "pgbench -R": "pgbench -R's latency runs from the transaction's scheduled start (schedule lag included)",
    "sysbench --rate": "sysbench --rate's latency runs from the event's generation (its time in sysbench's queue included)",
}


class GeneratorUnavailable(Exception):
    """The open-loop generator is not there and cannot be built (one line: why, and what to do)."""


@dataclass(frozen=True)
class OpenMeasurement:
    offered: float  # requests or transactions per second asked for
    achieved: float  # what the generator completed per second
    p50_ms: float  # from the intended send time where the generator knows it (see the module's text)
    p99_ms: float

    @property
    def ratio(self) -> float:
        return self.achieved / self.offered if self.offered else float("nan")

    @property
    def sustained(self) -> bool:
        return self.ratio >= SUSTAINED

    def metrics(self) -> dict:
        """The run's metrics: a p50 and a p99 only where the offered load was carried."""
        out = {"rate": self.achieved, "offered": self.offered, "achieved_ratio": self.ratio,
               "sustained": 1.0 if self.sustained else 0.0}
        if self.sustained:
            out.update(p50_ms=self.p50_ms, p99_ms=self.p99_ms)
        return out


def closed_if_unrated(found: OpenMeasurement, rate: Optional[float]) -> OpenMeasurement:
    """A closed-loop probe (no rate asked) offered what it achieved."""
    return found if rate else OpenMeasurement(found.achieved, found.achieved, found.p50_ms, found.p99_ms)


# ---- memtier_benchmark -------------------------------------------------------------------------------


def memtier_cache() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "temperd-bench", "memtier_benchmark")


def memtier_binary(explicit: Optional[str] = None, build: bool = True) -> str:
    """The memtier_benchmark to run: the one named (--memtier or TEMPERD_MEMTIER), else the cached
    build, else one on PATH, else built from MEMTIER_SRC into the cache (about a minute)."""
    named = explicit or os.environ.get("TEMPERD_MEMTIER")
    if named:
        if not os.access(named, os.X_OK):
            raise GeneratorUnavailable(f"memtier_benchmark {named} is not an executable file")
        return named
    cached = memtier_cache()
    if os.access(cached, os.X_OK):
        return cached
    found = shutil.which("memtier_benchmark")
    if found:
        return found
    script = os.path.join(MEMTIER_SRC, "build.sh")
    if not build or not os.path.exists(script):
        raise GeneratorUnavailable(f"memtier_benchmark not found and no source to build it from ({script}): "
                                   "set TEMPERD_MEMTIER to a binary or TEMPERD_MEMTIER_SRC to its source directory")
    os.makedirs(os.path.dirname(cached), exist_ok=True)
    out = subprocess.run(["bash", script, cached], capture_output=True, text=True, timeout=900)
    if out.returncode != 0 or not os.access(cached, os.X_OK):
        last = (out.stderr.strip() or out.stdout.strip() or "no output").splitlines()[-1]
        raise GeneratorUnavailable(f"memtier_benchmark could not be built from {MEMTIER_SRC}: {last}")
    return cached


def memtier_rate(total: float, connections: int) -> Tuple[int, float]:
    """(--rate-limiting per connection, the total rate memtier really offers for it): it sends
    ceil(rate / 50) requests per interval, at 1e6 // (rate // per-interval) microseconds."""
    per_conn = max(1, int(round(total / connections)))
    per_interval = (per_conn + 49) // 50
    interval_us = 1000000 // (per_conn // per_interval)
    return per_conn, connections * per_interval * 1e6 / interval_us


def memtier_argv(binary: str, port: int, protocol: str, connections: int, seconds: int, ratio: str, keys: int,
                 json_path: str, per_conn_rate: Optional[int] = None) -> List[str]:
    """One memtier thread, `connections` connections, random keys of the filled key space; open loop
    at `per_conn_rate` per connection, closed loop (pipeline 1) without it."""
    argv = [binary, "-s", "127.0.0.1", "-p", str(port), f"--protocol={protocol}", "-t", "1", "-c", str(connections),
            f"--test-time={seconds}", f"--ratio={ratio}", "--key-pattern=R:R", "--key-minimum=1",
            f"--key-maximum={keys}", "--data-size=64", "--hide-histogram", f"--json-out-file={json_path}"]
    if per_conn_rate:
        per_interval = (per_conn_rate + 49) // 50
        argv += [f"--rate-limiting={per_conn_rate}", f"--pipeline={MEMTIER_INTERVALS_IN_FLIGHT * per_interval}"]
    return argv


def memtier_fill_argv(binary: str, port: int, protocol: str, keys: int) -> List[str]:
    """Every key of the key space written once (64-byte values), so the GETs hit."""
    return [binary, "-s", "127.0.0.1", "-p", str(port), f"--protocol={protocol}", "-t", "1", "-c", "1",
            "--ratio=1:0", "--key-pattern=P:P", "--key-minimum=1", f"--key-maximum={keys}", "--data-size=64",
            "-n", "allkeys", "--pipeline=64", "--hide-histogram"]


def parse_memtier_json(text: str, offered: float) -> OpenMeasurement:
    """memtier's --json-out-file: the requests done per second and its HdrHistogram p50 and p99 (ms).
    The rate is the totals' count over the longer of the run's measured duration and its
    --test-time: memtier's own Ops/sec divides by a duration that starts at a connection's first
    request, and it read up to 1.5x the offered rate where connections started late on a busy host."""
    try:
        found = json.loads(text)
        stats = found["ALL STATS"]
        totals, cuts = stats["Totals"], stats["Totals"]["Percentile Latencies"]
        seconds = max(float(stats["Runtime"]["Total duration"]) / 1000.0,
                      float(found["configuration"].get("test_time") or 0))
        rate = float(totals["Count"]) / seconds if seconds > 0 else float(totals["Ops/sec"])
        return OpenMeasurement(offered, rate, float(cuts["p50.00"]), float(cuts["p99.00"]))
    except (ValueError, KeyError, TypeError, ZeroDivisionError) as exc:
        raise ValueError(f"unexpected memtier_benchmark JSON ({exc}): {text.strip()[:200]!r}") from None


# ---- pgbench -R and sysbench --rate ---------------------------------------------------------------------


def pgbench_rate_script(env: str, clients: int, seconds: int, rate: Optional[float]) -> str:
    """pgbench (at `rate` transactions per second with -R) with its per-transaction log printed after
    its report as lines `tx <log line>`; the log's latency (3rd field) includes the schedule lag."""
    limit = f"-R {rate:.0f} " if rate else ""
    return (f'd=$(mktemp -d) && cd "$d" && env {env} pgbench -c {clients} -j {min(clients, 2)} -T {seconds} {limit}'
            f'-l --log-prefix="$d/tx" 2>&1; status=$?; cat "$d"/tx.* 2>/dev/null | sed "s/^/tx /"; '
            f'rm -rf "$d"; exit $status')


def parse_pgbench(stdout: str, offered: float) -> OpenMeasurement:
    """pgbench's report (tps) and its log (`tx client tx_no latency_us script epoch us [lag_us]`)."""
    tps = re.search(r"^tps = ([\d.]+)", stdout, re.M)
    latencies = sorted(int(line.split()[3]) for line in stdout.splitlines()
                       if line.startswith("tx ") and len(line.split()) >= 4)
    if not tps or len(latencies) < 2:
        raise ValueError(f"unexpected pgbench output: {stdout.strip()[:300]!r}")
    cuts = statistics.quantiles(latencies, n=100)
    return OpenMeasurement(offered, float(tps.group(1)), cuts[49] / 1000.0, cuts[98] / 1000.0)


QUEUE_FULL = "The event queue is full"


def parse_sysbench(stdout: str, offered: float) -> OpenMeasurement:
    """sysbench's report: transactions per second, the 99th percentile and the middle of its latency
    histogram (--histogram=on). An event queue that overflowed (--rate beyond what it carries) ended
    the run: achieved 0, not sustained."""
    if QUEUE_FULL in stdout:
        return OpenMeasurement(offered, 0.0, float("nan"), float("nan"))
    tps = re.search(r"transactions:\s+\d+\s+\(([\d.]+) per sec", stdout)
    p99 = re.search(r"99th percentile:\s+([\d.]+)", stdout)
    if not tps or not p99:
        raise ValueError(f"unexpected sysbench output: {stdout.strip()[-300:]!r}")
    histogram = [(float(v), int(n)) for v, n in re.findall(r"^\s+([\d.]+) \|\*+\s+(\d+)$", stdout, re.M)]
    return OpenMeasurement(offered, float(tps.group(1)), histogram_quantile(histogram, 0.5), float(p99.group(1)))


def histogram_quantile(rows: Sequence[tuple], q: float) -> float:
    """The value at quantile q of (value, count) rows in ascending order."""
    total = sum(n for _, n in rows)
    seen = 0
    for value, count in rows:
        seen += count
        if total and seen >= q * total:
            return value
    return float("nan")


def parse_loads(text: str) -> List[float]:
    """--load 0.5,0.8: fractions of stock's idle-host rate, each in (0, 2]."""
    loads = [float(x) for x in text.split(",") if x.strip()]
    if not loads or any(not 0 < x <= 2 or math.isnan(x) for x in loads):
        raise ValueError(f"--load takes fractions of stock's rate such as 0.5,0.8; found {text!r}")
    return loads


def load_variant(fraction: float) -> str:
    return f"load={fraction:g}"


def fraction_of(variant: str) -> float:
    return float(variant.split("=", 1)[1])
