"""The workloads of the isolation bench: a server, its standard load generator and how to read
the generator's answer. Each is a Workload; WORKLOADS names them for --server.

A load variant is one shape of load (redis: 50 clients, saturated, and 1 client); a run's amount
of work is sized once per variant so a stock run on a quiet host takes about --seconds.
"""

from __future__ import annotations

import csv
import io
import re
import subprocess
from dataclasses import dataclass
from typing import Callable, ContextManager, Dict, FrozenSet, List, Sequence

import common as C

import servers as S  # noqa: E402  (tests/servers.py: real servers on loopback)


@dataclass(frozen=True)
class Measurement:
    rate: float  # requests, transactions, inferences or samples per second
    p50_ms: float
    p99_ms: float


class Workload:
    name = ""
    profile_id = ""  # the builtin profile temperd applies
    exclusive_group = ""  # its exclusive thread group (where idle_resume_us goes)
    tool = ""  # the load generator
    rate_unit = "rps"
    variants: Sequence[str] = ()
    notes = ""  # what a reader must know about the metric

    def server(self) -> ContextManager:
        raise NotImplementedError

    def prepare(self, server) -> None:
        pass

    def version(self, server) -> str:
        return server.version

    def pids(self, server) -> List[int]:
        """The server's processes (a process-per-connection server has more than one)."""
        return [server.pid]

    def treated(self, server, exclusive: FrozenSet[int]) -> bool:
        """temperd's plan is in force: the server's main thread is on the exclusive CPUs."""
        return C.affinity_of(server.pid) == exclusive

    def size(self, server, variant: str, seconds: float, timeout_s: float) -> int:
        """The amount of work for a run of about `seconds` (stock, no spinners)."""
        return max(1, int(round(seconds)))

    def load_argv(self, server, variant: str, amount: int) -> List[str]:
        raise NotImplementedError

    def parse(self, stdout: str) -> Measurement:
        raise NotImplementedError

    def describe(self, variant: str, amount: int) -> str:
        return f"{self.tool} {variant}, {amount} s per run"


def clients_of(variant: str) -> int:
    return int(variant.split("=", 1)[1])


class Redis(Workload):
    name = "redis"
    profile_id = "redis"
    exclusive_group = "event-loop"
    tool = "redis-benchmark"
    variants = ("c=50", "c=1")
    keys = 100000

    def server(self):
        return S.redis_server()

    def version(self, server) -> str:
        return server.version.split()[2]  # "Redis server v=7.0.15 sha=..."

    def prepare(self, server) -> None:
        # 100 000 keys as redis-benchmark -r names them (key:%012d), 64-byte values, one pipe.
        value = "v" * 64
        lines = []
        for i in range(self.keys):
            key = f"key:{i:012d}"
            lines.append(f"*3\r\n$3\r\nSET\r\n${len(key)}\r\n{key}\r\n${len(value)}\r\n{value}\r\n")
        cli = S.require("redis-cli", "redis-tools")
        out = subprocess.run([cli, "-h", S.LOOPBACK, "-p", str(server.port), "--pipe"], input="".join(lines),
                             capture_output=True, text=True, timeout=60)
        if out.returncode != 0 or "errors: 0" not in out.stdout:
            raise SystemExit(f"could not load the keys into redis: {(out.stdout + out.stderr).strip()[-300:]}")
        size = S.redis_cli(server, "DBSIZE")
        if int(size) != self.keys:
            raise SystemExit(f"redis has {size} keys after loading, expected {self.keys}")

    def size(self, server, variant: str, seconds: float, timeout_s: float) -> int:
        probe = 50000 if clients_of(variant) > 1 else 10000
        out = subprocess.run(self.load_argv(server, variant, probe), capture_output=True, text=True, timeout=timeout_s)
        return max(5000, int(round(self.parse(out.stdout).rate * seconds, -3)))

    def load_argv(self, server, variant: str, amount: int) -> List[str]:
        return ["redis-benchmark", "-h", S.LOOPBACK, "-p", str(server.port), "-t", "get", "-r", str(self.keys),
                "-c", str(clients_of(variant)), "-n", str(amount), "--csv"]

    def parse(self, stdout: str) -> Measurement:
        rows = [r for r in csv.DictReader(io.StringIO(stdout)) if r.get("test") == "GET"]
        if not rows:
            raise ValueError(f"no GET row in redis-benchmark output: {stdout.strip()[-300:]!r}")
        row = rows[-1]
        return Measurement(float(row["rps"]), float(row["p50_latency_ms"]), float(row["p99_latency_ms"]))

    def describe(self, variant: str, amount: int) -> str:
        return f"redis-benchmark -t get {variant.replace('c=', '-c ')} -n {amount}"


class Memcached(Workload):
    name = "memcached"
    profile_id = "memcached"
    exclusive_group = "workers"
    tool = "memcaslap"
    variants = ("c=16",)
    notes = "memcaslap reports a log2 histogram: p50 and p99 are bucket upper bounds (a factor of 2 coarse)"

    def server(self):
        return S.memcached_server()

    def load_argv(self, server, variant: str, amount: int) -> List[str]:
        return ["memcaslap", "-s", f"{S.LOOPBACK}:{server.port}", "-T", "1", "-c", str(clients_of(variant)),
                "-t", f"{amount}s", "-S", f"{amount}s"]

    def parse(self, stdout: str) -> Measurement:
        total = re.search(r"Run time: [\d.]+s Ops: \d+ TPS: (\d+)", stdout)
        section = stdout.split("Get Statistics (", 1)
        if not total or len(section) < 2:
            raise ValueError(f"unexpected memcaslap output: {stdout.strip()[-300:]!r}")
        dist = section[1].split("Log2 Dist:", 1)[1].split("\n\n", 1)[0]
        buckets: Dict[int, int] = {}
        for line in dist.strip().splitlines():
            head, _, counts = line.partition(":")
            base = int(head)
            for offset, count in enumerate(counts.split()):
                buckets[base + offset] = int(count)
        return Measurement(float(total.group(1)), log2_quantile(buckets, 0.50), log2_quantile(buckets, 0.99))


def log2_quantile(buckets: Dict[int, int], q: float) -> float:
    """Upper bound (ms) of the log2 microsecond bucket holding the q-quantile."""
    total = sum(buckets.values())
    seen = 0
    for exp in sorted(buckets):
        seen += buckets[exp]
        if total and seen >= q * total:
            return 2.0 ** (exp + 1) / 1000.0
    return float("nan")


WORKLOADS: Dict[str, Callable[[], Workload]] = {"redis": Redis, "memcached": Memcached}
