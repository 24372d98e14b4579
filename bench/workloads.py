"""The workloads of the isolation bench: a server, its standard load generator and how to read
the generator's answer. Each is a Workload; WORKLOADS names them for --server.

A load variant is one shape of load (redis: 50 clients, saturated, and 1 client); a run's amount
of work is sized once per variant so a stock run on a quiet host takes about --seconds.
"""

from __future__ import annotations

import contextlib
import csv
import io
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import Callable, ContextManager, Dict, FrozenSet, Iterator, List, Optional, Sequence

import common as C
import openloop as O  # bench/openloop.py
from openloop import histogram_quantile  # noqa: F401  (re-exported: the closed-loop parsers use it)

import servers as S  # noqa: E402  (tests/servers.py: real servers on loopback)
from temperd.sources import procfs  # noqa: E402

ML_WORKER = os.path.join(C.HERE, "ml_worker.py")
ML_PYTHON = os.environ.get("BENCH_ML_PYTHON", sys.executable)  # a Python with onnxruntime/onnx or torch


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
    expects_exclusive = True  # some thread matches the profile's exclusive group
    variants: Sequence[str] = ()
    notes = ""  # what a reader must know about the metric
    p99_resolution = 1.0  # a reported p99 may overstate the true one by this factor (2: a log2 bucket bound)
    open_tool = ""  # the open-loop generator (bench/openloop.py); "" where there is none
    open_resolution = 1.0  # the open-loop generator's p99 resolution (HdrHistogram, exact quantiles: 1)

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
        """temperd's plan is in force: some thread of the server is on the exclusive CPUs or, where
        the profile gives none (a trained profile of latency and yield groups), has a nice value or
        policy temperd set."""
        tids = [tid for pid in self.pids(server) for tid in (procfs.list_tids(pid) or ())]
        if exclusive:
            return any(C.affinity_of(tid) == exclusive for tid in tids)
        return any(_touched(tid) for tid in tids)

    def size(self, server, variant: str, seconds: float, timeout_s: float) -> int:
        """The amount of work for a run of about `seconds` (stock, no spinners)."""
        return max(1, int(round(seconds)))

    def load_argv(self, server, variant: str, amount: int) -> List[str]:
        raise NotImplementedError

    def parse(self, stdout: str) -> Measurement:
        raise NotImplementedError

    def describe(self, variant: str, amount: int) -> str:
        return f"{self.tool} {variant}, {amount} s per run"

    # ---- open loop (bench/openloop.py): a rate held equal across arms ----

    def open_connections(self) -> int:
        return clients_of(self.variants[0])

    def prepare_open(self, server) -> None:
        pass

    def offered_rate(self, rate: float) -> float:
        """What the generator really offers when asked for `rate` per second."""
        return float(round(rate))

    def open_argv(self, server, rate: Optional[float], seconds: int, out_dir: str) -> List[str]:
        """The open-loop generator at `rate` per second for `seconds`; closed loop (as fast as it is
        answered, same connections) where rate is None: stock's idle-host rate is measured so."""
        raise NotImplementedError

    def parse_open(self, stdout: str, out_dir: str, rate: Optional[float]) -> O.OpenMeasurement:
        raise NotImplementedError

    def describe_open(self, rate: float, seconds: int) -> str:
        return f"{self.open_tool} at {rate:,.0f}/s, {self.open_connections()} connections, {seconds} s per run"


class MemtierLoad(Workload):
    """redis and memcached under memtier_benchmark, open loop (--rate-limiting) or closed."""

    open_tool = "memtier_benchmark"
    protocol = ""
    ratio = ""  # SET:GET
    keys = 100000
    memtier = ""  # the binary (openloop.memtier_binary), set by the bench before the first run

    def prepare_open(self, server) -> None:
        out = subprocess.run(O.memtier_fill_argv(self.memtier, server.port, self.protocol, self.keys),
                             capture_output=True, text=True, timeout=300)
        if out.returncode != 0:
            raise SystemExit(f"memtier_benchmark could not fill {self.name}: {(out.stdout + out.stderr).strip()[-300:]}")

    def offered_rate(self, rate: float) -> float:
        return O.memtier_rate(rate, self.open_connections())[1]

    def open_argv(self, server, rate: Optional[float], seconds: int, out_dir: str) -> List[str]:
        per_conn = O.memtier_rate(rate, self.open_connections())[0] if rate else None
        return O.memtier_argv(self.memtier, server.port, self.protocol, self.open_connections(), seconds, self.ratio,
                              self.keys, os.path.join(out_dir, "memtier.json"), per_conn)

    def parse_open(self, stdout: str, out_dir: str, rate: Optional[float]) -> O.OpenMeasurement:
        try:
            with open(os.path.join(out_dir, "memtier.json")) as handle:
                text = handle.read()
        except OSError:
            raise ValueError(f"memtier_benchmark wrote no JSON: {stdout.strip()[-300:]!r}") from None
        found = O.parse_memtier_json(text, rate or 0.0)
        return O.closed_if_unrated(found, rate)

    def describe_open(self, rate: float, seconds: int) -> str:
        return (f"memtier_benchmark --ratio={self.ratio} at {rate:,.0f}/s (--rate-limiting "
                f"{O.memtier_rate(rate, self.open_connections())[0]} x {self.open_connections()} connections), "
                f"{seconds} s per run")


def clients_of(variant: str) -> int:
    return int(variant.split("=", 1)[1])


class Redis(MemtierLoad):
    name = "redis"
    profile_id = "redis"
    exclusive_group = "event-loop"
    tool = "redis-benchmark"
    variants = ("c=50", "c=1")
    keys = 100000
    protocol = "redis"
    ratio = "0:1"  # GETs only, as redis-benchmark -t get

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


class Memcached(MemtierLoad):
    name = "memcached"
    profile_id = "memcached"
    exclusive_group = "workers"
    tool = "memcaslap"
    variants = ("c=16",)
    notes = "memcaslap reports a log2 histogram: p50 and p99 are bucket upper bounds (a factor of 2 coarse)"
    p99_resolution = 2.0
    protocol = "memcache_text"
    ratio = "1:9"  # memcaslap's default mix

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
    return histogram_quantile([(2.0 ** (exp + 1) / 1000.0, buckets[exp]) for exp in sorted(buckets)], q)


class MariaDB(Workload):
    name = "mariadb"
    profile_id = "mysql-innodb"
    exclusive_group = "connections"
    tool = "sysbench"
    rate_unit = "tps"
    expects_exclusive = False
    variants = ("threads=8",)
    notes = ("MariaDB 10.11 leaves its threads unnamed (every comm is mariadbd): the builtin mysql-innodb "
             "profile's exclusive `connections` group finds no thread and its `unnamed` group (latency, nice -5) "
             "takes them all; p50 is the middle of sysbench's latency histogram, p99 its --percentile=99")

    def server(self):
        return S.mariadb_server(performance_schema=False)

    def version(self, server) -> str:
        found = re.search(r"Ver (\S+)", server.version)
        return found.group(1) if found else server.version

    def treated(self, server, exclusive: FrozenSet[int]) -> bool:
        """No thread is in the exclusive group on 10.11: the plan is in force once its threads got
        a latency group's negative nice (the builtin's `unnamed` group -5, a trained one's -10)."""
        return any(os.getpriority(os.PRIO_PROCESS, tid) < 0 for tid in procfs.list_tids(server.pid) or ())

    def load_argv(self, server, variant: str, amount: int) -> List[str]:
        return ["sysbench", "oltp_read_write", f"--mysql-host={S.LOOPBACK}", f"--mysql-port={server.port}",
                "--mysql-user=sb", "--mysql-password=sb", "--mysql-db=sbtest", "--db-driver=mysql",
                "--tables=1", "--table-size=2000", f"--threads={variant.split('=')[1]}", f"--time={amount}",
                "--percentile=99", "--histogram=on", "run"]

    def parse(self, stdout: str) -> Measurement:
        found = O.parse_sysbench(stdout, 0.0)
        if found.achieved != found.achieved or O.QUEUE_FULL in stdout:
            raise ValueError(f"unexpected sysbench output: {stdout.strip()[-300:]!r}")
        return Measurement(found.achieved, found.p50_ms, found.p99_ms)

    open_tool = "sysbench --rate"

    def open_argv(self, server, rate: Optional[float], seconds: int, out_dir: str) -> List[str]:
        argv = self.load_argv(server, self.variants[0], seconds)
        return argv[:-1] + ([f"--rate={rate:.0f}"] if rate else []) + argv[-1:]

    def parse_open(self, stdout: str, out_dir: str, rate: Optional[float]) -> O.OpenMeasurement:
        found = O.parse_sysbench(stdout, rate or 0.0)
        return O.closed_if_unrated(found, rate)

    def describe(self, variant: str, amount: int) -> str:
        return f"sysbench oltp_read_write --{variant} --time={amount} --percentile=99 (1 table, 2 000 rows)"


class PostgreSQL(Workload):
    name = "postgresql"
    profile_id = "postgresql"
    exclusive_group = "backends"
    tool = "pgbench"
    rate_unit = "tps"
    expects_exclusive = False  # backends come with pgbench's connections, after the arm is in force
    variants = ("c=4",)
    notes = ("pgbench TPC-B-like, scale 1, fsync off; its connections are new backends each run (forked by the "
             "postmaster, titled, matched and placed while the run starts); p50/p99 from every transaction's "
             "latency in pgbench --log")

    def server(self):
        return S.postgresql_server()

    def version(self, server) -> str:
        found = re.search(r"(\d+\.\d+)", server.version)
        return found.group(1) if found else server.version

    def pids(self, server) -> List[int]:
        return [server.pid, *S.child_pids(server.pid)]

    def treated(self, server, exclusive: FrozenSet[int]) -> bool:
        """No backend exists between runs: the plan is in force once temperd set the postmaster's
        nice or policy (the builtin's postmaster group: latency; a trained profile's: its group's)."""
        return _touched(server.pid)

    def load_argv(self, server, variant: str, amount: int) -> List[str]:
        # pgbench writes one log line per transaction (latency in us, 3rd field) into files of its
        # own; they are printed after its report and removed, so parse() reads both from stdout.
        return ["/bin/sh", "-c", O.pgbench_rate_script(self._env(server), clients_of(variant), amount, None)]

    def parse(self, stdout: str) -> Measurement:
        found = O.parse_pgbench(stdout, 0.0)
        return Measurement(found.achieved, found.p50_ms, found.p99_ms)

    @staticmethod
    def _env(server) -> str:
        return f"PGHOST={S.LOOPBACK} PGPORT={server.port} PGUSER=postgres PGDATABASE=postgres"

    open_tool = "pgbench -R"

    def open_argv(self, server, rate: Optional[float], seconds: int, out_dir: str) -> List[str]:
        return ["/bin/sh", "-c", O.pgbench_rate_script(self._env(server), self.open_connections(), seconds, rate)]

    def parse_open(self, stdout: str, out_dir: str, rate: Optional[float]) -> O.OpenMeasurement:
        found = O.parse_pgbench(stdout, rate or 0.0)
        return O.closed_if_unrated(found, rate)

    def describe(self, variant: str, amount: int) -> str:
        return f"pgbench -c {clients_of(variant)} -T {amount} (TPC-B-like, scale 1)"


class JvmService(Workload):
    name = "jvm"
    profile_id = ""  # no builtin profile: the trained arm is what temperd knows of it
    exclusive_group = ""
    tool = "http_load.py"
    expects_exclusive = False
    variants = ("c=4",)
    notes = ("tests/jvm/TrainingService.java: a req-handler-N pool and a CPU-heavy report-builder thread in one "
             "JVM; the load is tests/jvm/http_load.py (keep-alive Python clients, latency per request)")

    def server(self):
        return S.jvm_service()

    def prepare(self, server) -> None:
        subprocess.run(self.load_argv(server, "c=4", 3), capture_output=True, timeout=60)  # the JIT warmed

    def load_argv(self, server, variant: str, amount: int) -> List[str]:
        return [sys.executable, os.path.join(S.JVM_DIR, "http_load.py"), str(server.port), str(amount),
                str(clients_of(variant))]

    def parse(self, stdout: str) -> Measurement:
        found = re.search(r"requests \d+ rps ([\d.]+) p50_ms ([\d.]+) p99_ms ([\d.]+)", stdout)
        if not found:
            raise ValueError(f"unexpected http_load.py output: {stdout.strip()[-300:]!r}")
        return Measurement(*(float(x) for x in found.groups()))

    def describe(self, variant: str, amount: int) -> str:
        return f"http_load.py {variant.replace('c=', '')} keep-alive clients, {amount} s per run"


def _touched(tid: int) -> bool:
    try:
        return os.getpriority(os.PRIO_PROCESS, tid) != 0 or os.sched_getscheduler(tid) != os.SCHED_OTHER
    except OSError:
        return False


@dataclass
class MlServer:
    pid: int
    port: int
    version: str


@contextlib.contextmanager
def ml_worker(mode: str, *extra: str) -> Iterator[MlServer]:
    """bench/ml_worker.py MODE in its own session, as a service manager starts it; stopped on exit."""
    log = tempfile.TemporaryFile(mode="w+")
    port = S.free_port()
    proc = subprocess.Popen([ML_PYTHON, ML_WORKER, mode, "--port", str(port), *extra], stdout=log,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        S.wait_for_port(port, proc, f"ml_worker {mode}", timeout=120)
        version = subprocess.run([ML_PYTHON, "-c", f"import {'onnxruntime as m' if mode == 'onnx' else 'torch as m'};"
                                  "print(m.__version__)"], capture_output=True, text=True, timeout=60).stdout.strip()
        yield MlServer(proc.pid, port, version)
    except S.ServerUnavailable:
        log.seek(0)
        raise S.ServerUnavailable(f"ml_worker {mode} did not start: {log.read()[-500:]}")
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()


class MlWorkload(Workload):
    mode = ""
    worker_args: Sequence[str] = ()

    def server(self):
        return ml_worker(self.mode, *self.worker_args)

    def pids(self, server) -> List[int]:
        return [server.pid, *S.child_pids(server.pid)]

    def size(self, server, variant: str, seconds: float, timeout_s: float) -> int:
        return max(2, int(round(seconds)))

    def load_argv(self, server, variant: str, amount: int) -> List[str]:
        return [ML_PYTHON, ML_WORKER, "client", "--port", str(server.port), "--seconds", str(amount)]

    def parse(self, stdout: str) -> Measurement:
        import json

        found = json.loads(stdout.strip().splitlines()[-1])
        return Measurement(found["rate"], found["p50_ms"], found["p99_ms"])


class Onnx(MlWorkload):
    name = "onnx"
    profile_id = "onnx-inference"
    exclusive_group = "intra-op"
    tool = "ml_worker onnx"
    rate_unit = "inf/s"
    variants = ("batch=64",)
    mode = "onnx"
    notes = ("ONNX Runtime (PyPI) on a model built with onnx.helper: 8 x MatMul 512x512 + Relu, batch 64, "
             "default intra-op threads (2 here); p50/p99 per inference")

    def describe(self, variant: str, amount: int) -> str:
        return f"ONNX Runtime, 8 x MatMul 512 + Relu, {variant}, {amount} s per run"


class DataLoaderFeed(MlWorkload):
    name = "dataloader"
    profile_id = "pytorch-training"
    exclusive_group = "data-workers"
    tool = "ml_worker dataloader"
    rate_unit = "samp/s"
    variants = ("workers=2",)
    mode = "dataloader"
    worker_args = ("--sample-ms", "1.0", "--step-ms", "20")
    notes = ("torch DataLoader (PyPI torch), 2 persistent worker processes, 1 ms of CPU per sample, batch 16, "
             "feeding a SIMULATED accelerator: a consumer that sleeps 20 ms per batch, standing in for a GPU step "
             "(ideal 800 samples/s); p50/p99 = how long the accelerator waited for each batch")

    def describe(self, variant: str, amount: int) -> str:
        return f"DataLoader {variant} -> simulated accelerator (20 ms/batch), {amount} s per run"


WORKLOADS: Dict[str, Callable[[], Workload]] = {"redis": Redis, "memcached": Memcached, "mariadb": MariaDB,
                                                 "onnx": Onnx, "dataloader": DataLoaderFeed, "jvm": JvmService,
                                                 "postgresql": PostgreSQL}
