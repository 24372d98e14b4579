"""Real servers from the distribution's packages, started on 127.0.0.1 for tests and evidence.

pytest-free: each ``*_server()`` context manager starts one server in a fresh temporary
directory on a free loopback port, yields a :class:`RunningServer` and stops it (and removes the
directory) on exit. Servers that cannot run here raise :class:`ServerUnavailable` with the
reason (binary or load tool missing); tests turn that into a skip.

Every load is bounded in time: the tools are given their own time limit where they have one and
are terminated, then killed, at the deadline in any case.

When run as root the servers drop to their packaged service users (memcache, redis, postgres,
mysql) as their init scripts would; the temporary directory is handed to that user.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from temperd.sources.procfs import normalise_cmdline

LOOPBACK = "127.0.0.1"
START_TIMEOUT_S = 15.0
STOP_TIMEOUT_S = 10.0
LOAD_GRACE_S = 5.0


class ServerUnavailable(Exception):
    """The server cannot be started on this host; str() says why (for a test skip)."""


# ---- /proc readers ---------------------------------------------------------------------------


def thread_names(pid: int) -> Dict[int, str]:
    """tid -> comm of every thread of the process (empty if it is gone)."""
    names: Dict[int, str] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return names
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/comm", encoding="utf-8", errors="replace") as f:
                names[int(tid)] = f.read().rstrip("\n")
        except OSError:
            continue  # the thread exited between listdir and open
    return names


def process_title(pid: int) -> str:
    """The process title as the matcher sees it: cmdline arguments joined by spaces."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return " ".join(normalise_cmdline(f.read()))
    except OSError:
        return ""


def child_pids(pid: int) -> List[int]:
    """Direct children of the process, from /proc/PID/task/*/children."""
    kids: List[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return kids
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", encoding="ascii") as f:
                kids.extend(int(k) for k in f.read().split())
        except OSError:
            continue
    return sorted(set(kids))


def thread_runtimes(pid: int) -> Dict[int, Tuple[str, int]]:
    """tid -> (comm, nanoseconds on CPU so far) from /proc/PID/task/TID/schedstat."""
    out: Dict[int, Tuple[str, int]] = {}
    for tid, comm in thread_names(pid).items():
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat", encoding="ascii") as f:
                out[tid] = (comm, int(f.read().split()[0]))
        except (OSError, ValueError, IndexError):
            continue
    return out


def cpu_ms_by_name(before: Dict[int, Tuple[str, int]], after: Dict[int, Tuple[str, int]]) -> Dict[str, float]:
    """CPU milliseconds per thread name between two :func:`thread_runtimes` snapshots.

    Threads that started in between count from zero; threads that exited are not counted.
    """
    totals: Dict[str, float] = {}
    for tid, (comm, ns) in after.items():
        start = before.get(tid, (comm, 0))[1]
        totals[comm] = totals.get(comm, 0.0) + max(0, ns - start) / 1e6
    return totals


@dataclass
class Observation:
    """What a server's process tree looked like over a number of /proc samples."""

    samples: int = 0
    # comm -> the most threads with that name seen at once in the server process
    max_threads: Counter = field(default_factory=Counter)
    # comm -> how many samples saw at least one such thread
    seen_in: Counter = field(default_factory=Counter)
    # child process title -> how many samples saw it (titles with client ports vary per sample)
    child_titles: Counter = field(default_factory=Counter)
    # comm of child processes' threads -> most seen at once
    child_threads: Counter = field(default_factory=Counter)

    def add_sample(self, pid: int) -> None:
        names = Counter(thread_names(pid).values())
        if not names:
            return
        self.samples += 1
        for comm, count in names.items():
            self.max_threads[comm] = max(self.max_threads[comm], count)
            self.seen_in[comm] += 1
        child_comms: Counter = Counter()
        for child in child_pids(pid):
            title = process_title(child)
            if title:
                self.child_titles[title] += 1
            child_comms.update(thread_names(child).values())
        for comm, count in child_comms.items():
            self.child_threads[comm] = max(self.child_threads[comm], count)

    @property
    def names(self) -> List[str]:
        return sorted(self.max_threads)


def sample_until(pid: int, done: Callable[[], bool], *, interval: float = 0.1,
                 limit_s: float = 30.0, observation: Optional[Observation] = None) -> Observation:
    """Sample the process tree every ``interval`` seconds until ``done()`` or ``limit_s``."""
    obs = observation or Observation()
    deadline = time.monotonic() + limit_s
    while True:
        obs.add_sample(pid)
        if done() or time.monotonic() >= deadline:
            return obs
        time.sleep(interval)


# ---- bounded load ------------------------------------------------------------------------------


@dataclass
class LoadResult:
    tool: str
    seconds: float
    returncodes: Tuple[int, ...]
    output_tail: str

    @property
    def ok(self) -> bool:
        return all(rc == 0 for rc in self.returncodes)


class Load:
    """One or more load-generator processes running against a server, with a hard deadline."""

    def __init__(self, tool: str, argvs: Sequence[Sequence[str]], seconds: float, workdir: str,
                 *, self_limited: bool, env: Optional[Dict[str, str]] = None):
        self.tool = tool
        self.seconds = seconds
        # Tools with their own time limit get a grace period to finish and report; the others
        # are stopped at the deadline (their exit status then does not count as failure).
        self.self_limited = self_limited
        self.started = time.monotonic()
        self.deadline = self.started + seconds + (LOAD_GRACE_S if self_limited else 0.0)
        self._log = os.path.join(workdir, f"load-{tool}-{int(self.started * 1000)}.log")
        self._out = open(self._log, "wb")
        self.procs: List[subprocess.Popen] = []
        try:
            for argv in argvs:
                self.procs.append(subprocess.Popen(list(argv), stdout=self._out, stderr=subprocess.STDOUT,
                                                   stdin=subprocess.DEVNULL, env=env, start_new_session=True))
        except BaseException:
            self._stop_all()
            self._out.close()
            raise

    def running(self) -> bool:
        if time.monotonic() >= self.deadline:
            return False
        return any(p.poll() is None for p in self.procs)

    def wait(self) -> LoadResult:
        while self.running():
            time.sleep(0.05)
        stopped_by_us = any(p.poll() is None for p in self.procs)
        self._stop_all()
        self._out.close()
        with open(self._log, "rb") as f:
            tail = f.read()[-4000:].decode("utf-8", "replace")
        codes = tuple(0 if (stopped_by_us and not self.self_limited) else (p.returncode or 0) for p in self.procs)
        return LoadResult(self.tool, time.monotonic() - self.started, codes, tail)

    def _stop_all(self) -> None:
        for p in self.procs:
            _stop_process(p, signal.SIGINT, 2.0)


def _stop_process(proc: subprocess.Popen, sig: int, timeout: float) -> None:
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)
    try:
        proc.wait(timeout)
        return
    except subprocess.TimeoutExpired:
        pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(STOP_TIMEOUT_S)


# ---- a running server --------------------------------------------------------------------------


@dataclass
class RunningServer:
    name: str
    version: str
    pid: int
    port: int
    workdir: str
    start_load: Callable[[float], Load]  # bounded load for about that many seconds
    extra: Dict[str, str] = field(default_factory=dict)

    def load(self, seconds: float = 2.0) -> LoadResult:
        return self.start_load(seconds).wait()

    def observe_load(self, seconds: float = 2.0, interval: float = 0.1) -> Tuple[Observation, LoadResult]:
        """Sample the server's threads (and children) while a bounded load runs."""
        load = self.start_load(seconds)
        obs = sample_until(self.pid, lambda: not load.running(), interval=interval,
                           limit_s=seconds + LOAD_GRACE_S)
        return obs, load.wait()


# ---- helpers -------------------------------------------------------------------------------------


def require(binary: str, package: str, extra_dirs: Sequence[str] = ()) -> str:
    path = shutil.which(binary)
    if path is None:
        for directory in extra_dirs:
            candidate = os.path.join(directory, binary)
            if os.access(candidate, os.X_OK):
                return candidate
        raise ServerUnavailable(f"{binary} not found (Debian package {package})")
    return path


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def wait_for_port(port: int, proc: subprocess.Popen, what: str, timeout: float = START_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with status {proc.returncode} before listening on {port}")
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.settimeout(0.2)
            if s.connect_ex((LOOPBACK, port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on {LOOPBACK}:{port} within {timeout:.0f} s")


def _service_user(name: str) -> Optional[Tuple[int, int]]:
    """(uid, gid) of the packaged service user when we are root and it exists, else None."""
    if os.geteuid() != 0:
        return None
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise ServerUnavailable(f"service user {name!r} does not exist (is the package installed?)")
    return entry.pw_uid, entry.pw_gid


def _user_kwargs(ids: Optional[Tuple[int, int]]) -> dict:
    if ids is None:
        return {}
    uid, gid = ids
    return {"user": uid, "group": gid, "extra_groups": []}


@contextlib.contextmanager
def _workdir(prefix: str, owner: Optional[Tuple[int, int]]) -> Iterator[str]:
    path = tempfile.mkdtemp(prefix=f"{prefix}-")
    try:
        if owner is not None:
            os.chown(path, *owner)
        os.chmod(path, 0o755)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _version(argv: Sequence[str]) -> str:
    out = subprocess.run(list(argv), capture_output=True, text=True, timeout=10)
    text = (out.stdout or out.stderr).strip().splitlines()
    return text[0].strip() if text else "unknown"


@contextlib.contextmanager
def _supervised(argv: Sequence[str], log_path: str, ids: Optional[Tuple[int, int]],
                stop_signal: int = signal.SIGTERM, **popen) -> Iterator[subprocess.Popen]:
    log = open(log_path, "wb")
    proc = subprocess.Popen(list(argv), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True, **_user_kwargs(ids), **popen)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(stop_signal)
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(STOP_TIMEOUT_S)
        log.close()


# ---- memcached -----------------------------------------------------------------------------------


@contextlib.contextmanager
def memcached_server(threads: int = 4, memory_mb: int = 64) -> Iterator[RunningServer]:
    """memcached -t THREADS on a free loopback port; load = memcaslap (libmemcached-tools)."""
    binary = require("memcached", "memcached")
    memcaslap = require("memcaslap", "libmemcached-tools")
    as_root = os.geteuid() == 0
    if as_root:
        _service_user("memcache")
    port = free_port()
    with _workdir("memcached", None) as workdir:
        argv = [binary, "-l", LOOPBACK, "-p", str(port), "-U", "0", "-t", str(threads), "-m", str(memory_mb)]
        if as_root:
            argv += ["-u", "memcache"]  # memcached drops privileges itself
        with _supervised(argv, os.path.join(workdir, "memcached.log"), None) as proc:
            wait_for_port(port, proc, "memcached")

            def start_load(seconds: float) -> Load:
                secs = max(1, int(round(seconds)))
                return Load("memcaslap", [[memcaslap, "-s", f"{LOOPBACK}:{port}", "-T", "2", "-c", "16", "-t", f"{secs}s"]],
                            secs, workdir, self_limited=True)

            yield RunningServer("memcached", _version([binary, "-V"]), proc.pid, port, workdir, start_load)


# ---- redis ----------------------------------------------------------------------------------------


@contextlib.contextmanager
def redis_server(io_threads: int = 1, appendonly: bool = False) -> Iterator[RunningServer]:
    """redis-server on a free loopback port, no persistence unless ``appendonly``; load = redis-benchmark.

    ``io_threads`` > 1 starts io_thd_1..N-1 and lets them read too (io-threads-do-reads).
    """
    binary = require("redis-server", "redis-server")
    bench = require("redis-benchmark", "redis-tools")
    ids = _service_user("redis")
    port = free_port()
    with _workdir("redis", ids) as workdir:
        argv = [binary, "--bind", LOOPBACK, "--port", str(port), "--save", "", "--dir", workdir,
                "--appendonly", "yes" if appendonly else "no", "--daemonize", "no", "--protected-mode", "yes"]
        if io_threads > 1:
            argv += ["--io-threads", str(io_threads), "--io-threads-do-reads", "yes"]
        with _supervised(argv, os.path.join(workdir, "redis.log"), ids, cwd=workdir) as proc:
            wait_for_port(port, proc, "redis-server")

            def start_load(seconds: float) -> Load:
                # redis-benchmark has no time limit: a request count it cannot reach, stopped at the deadline.
                argv_load = [bench, "-h", LOOPBACK, "-p", str(port), "-t", "set,get", "-r", "10000",
                             "-c", "20", "-n", "100000000", "-q"]
                return Load("redis-benchmark", [argv_load], seconds, workdir, self_limited=False)

            yield RunningServer("redis", _version([binary, "--version"]), proc.pid, port, workdir, start_load)


def redis_cli(server: RunningServer, *args: str, timeout: float = 10) -> str:
    """Run one redis-cli command against a server from :func:`redis_server`."""
    cli = require("redis-cli", "redis-tools")
    out = subprocess.run([cli, "-h", LOOPBACK, "-p", str(server.port), *args], capture_output=True,
                         text=True, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"redis-cli {' '.join(args)} failed: {out.stderr.strip()[-300:]}")
    return out.stdout.strip()


# ---- PostgreSQL -----------------------------------------------------------------------------------


def postgresql_bindir() -> str:
    """The newest /usr/lib/postgresql/<major>/bin that has postgres and initdb (Debian layout)."""
    candidates = []
    for path in glob.glob("/usr/lib/postgresql/*/bin"):
        major = os.path.basename(os.path.dirname(path))
        if major.isdigit() and all(os.access(os.path.join(path, b), os.X_OK) for b in ("postgres", "initdb", "pg_ctl")):
            candidates.append((int(major), path))
    if not candidates:
        raise ServerUnavailable("no /usr/lib/postgresql/<major>/bin with postgres, initdb and pg_ctl (Debian package postgresql)")
    return max(candidates)[1]


@contextlib.contextmanager
def postgresql_server(cluster_name: Optional[str] = None) -> Iterator[RunningServer]:
    """A throwaway cluster (initdb) on a free loopback port, Unix socket in its directory; load = pgbench.

    ``cluster_name`` shows in every process title ("postgres: <cluster_name>: ..."); Debian's
    clusters set it to "<major>/<name>", e.g. "15/main". Default: "<major>/evidence".
    """
    bindir = postgresql_bindir()
    pgbench = require("pgbench", "postgresql-client")
    ids = _service_user("postgres")
    major = os.path.basename(os.path.dirname(bindir))
    cluster_name = cluster_name if cluster_name is not None else f"{major}/evidence"
    port = free_port()
    with _workdir("postgresql", ids) as workdir:
        datadir = os.path.join(workdir, "data")
        init = subprocess.run([os.path.join(bindir, "initdb"), "-D", datadir, "-A", "trust", "-U", "postgres",
                               "-E", "UTF8", "--no-sync"], capture_output=True, text=True, timeout=60,
                              cwd=workdir, **_user_kwargs(ids))
        if init.returncode != 0:
            raise RuntimeError(f"initdb failed: {init.stderr.strip()[-500:]}")
        argv = [os.path.join(bindir, "postgres"), "-D", datadir, "-p", str(port), "-k", workdir,
                "-c", f"listen_addresses={LOOPBACK}", "-c", "fsync=off", "-c", "shared_buffers=32MB",
                "-c", "max_connections=30"]
        if cluster_name:
            argv += ["-c", f"cluster_name={cluster_name}"]
        # SIGINT = PostgreSQL's "fast" shutdown: clients are disconnected, no long wait.
        with _supervised(argv, os.path.join(workdir, "postgres.log"), ids,
                         stop_signal=signal.SIGINT, cwd=workdir) as proc:
            wait_for_port(port, proc, "postgres")
            env = dict(os.environ, PGHOST=LOOPBACK, PGPORT=str(port), PGUSER="postgres", PGDATABASE="postgres")
            prepared = subprocess.run([pgbench, "-i", "-s", "1", "-q"], capture_output=True, text=True,
                                      timeout=60, env=env)
            if prepared.returncode != 0:
                raise RuntimeError(f"pgbench -i failed: {prepared.stderr.strip()[-500:]}")

            def start_load(seconds: float) -> Load:
                secs = max(1, int(round(seconds)))
                return Load("pgbench", [[pgbench, "-c", "4", "-j", "2", "-T", str(secs)]], secs, workdir,
                            self_limited=True, env=env)

            version = _version([os.path.join(bindir, "postgres"), "--version"])
            yield RunningServer("postgresql", version, proc.pid, port, workdir, start_load,
                                extra={"cluster_name": cluster_name, "socket_dir": workdir})


def start_parallel_query(server: RunningServer, seconds: float = 2.0) -> Load:
    """A parallel sequential scan on pgbench_accounts, cancelled by statement_timeout after ``seconds``.

    Planner costs are zeroed so PostgreSQL starts parallel workers even on the small table; the
    per-row pg_sleep keeps them running long enough to be seen. The load ends with a statement
    timeout error by design.
    """
    psql = require("psql", "postgresql-client")
    ms = int(seconds * 1000)
    sql = (f"SET statement_timeout = {ms}; SET parallel_setup_cost = 0; SET parallel_tuple_cost = 0; "
           "SET min_parallel_table_scan_size = 0; SET max_parallel_workers_per_gather = 2; "
           "SELECT count(*) FROM pgbench_accounts WHERE pg_sleep(0.0001) IS NOT NULL;")
    env = dict(os.environ, PGHOST=LOOPBACK, PGPORT=str(server.port), PGUSER="postgres", PGDATABASE="postgres")
    return Load("psql-parallel", [[psql, "-X", "-q", "-c", sql]], seconds, server.workdir, self_limited=True, env=env)


# ---- MariaDB ----------------------------------------------------------------------------------------


def _mariadb_client(socket_path: str, sql: str, client: str, timeout: float = 30) -> str:
    out = subprocess.run([client, "--no-defaults", "-S", socket_path, "-uroot", "-N", "-B", "-e", sql],
                         capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"mariadb client failed: {out.stderr.strip()[-500:]}")
    return out.stdout


@contextlib.contextmanager
def mariadb_server(performance_schema: bool = True, connections: int = 4,
                   sysbench_test: str = "oltp_read_write") -> Iterator[RunningServer]:
    """mariadbd on a throwaway datadir (mariadb-install-db) and a free loopback port.

    Load = sysbench ``sysbench_test`` (``connections`` threads, one small table) when sysbench is
    installed, else as many mariadb client connections running a bounded CPU-heavy query.
    ``performance_schema`` lets :func:`mariadb_thread_roles` map thread ids to P_S names.
    """
    binary = require("mariadbd", "mariadb-server", extra_dirs=("/usr/sbin",))
    install_db = require("mariadb-install-db", "mariadb-server")
    client = require("mariadb", "mariadb-client")
    sysbench = shutil.which("sysbench")
    ids = _service_user("mysql")
    port = free_port()
    with _workdir("mariadb", ids) as workdir:
        datadir = os.path.join(workdir, "data")
        sock = os.path.join(workdir, "mysqld.sock")
        user_args = ["--user=mysql"] if ids is not None else []
        init = subprocess.run([install_db, "--no-defaults", f"--datadir={datadir}", "--skip-test-db",
                               "--auth-root-authentication-method=normal", *user_args],
                              capture_output=True, text=True, timeout=120, cwd=workdir)
        if init.returncode != 0:
            raise RuntimeError(f"mariadb-install-db failed: {(init.stdout + init.stderr).strip()[-500:]}")
        argv = [binary, "--no-defaults", *user_args, f"--datadir={datadir}", f"--socket={sock}",
                f"--pid-file={os.path.join(workdir, 'mariadbd.pid')}", f"--bind-address={LOOPBACK}",
                f"--port={port}", "--skip-name-resolve", "--innodb-buffer-pool-size=64M",
                f"--performance-schema={'ON' if performance_schema else 'OFF'}",
                f"--log-error={os.path.join(workdir, 'error.log')}"]
        with _supervised(argv, os.path.join(workdir, "mariadbd.out"), None, cwd=workdir) as proc:
            wait_for_port(port, proc, "mariadbd", timeout=30)
            _mariadb_client(sock, "CREATE DATABASE sbtest; CREATE USER sb@'127.0.0.1' IDENTIFIED BY 'sb'; "
                                  "GRANT ALL ON sbtest.* TO sb@'127.0.0.1'", client)
            sb_common = [f"--mysql-host={LOOPBACK}", f"--mysql-port={port}", "--mysql-user=sb",
                         "--mysql-password=sb", "--mysql-db=sbtest", "--db-driver=mysql",
                         "--tables=1", "--table-size=2000"]
            if sysbench:
                prepared = subprocess.run([sysbench, "oltp_read_write", *sb_common, "prepare"],
                                          capture_output=True, text=True, timeout=60)
                if prepared.returncode != 0:
                    raise RuntimeError(f"sysbench prepare failed: {prepared.stderr.strip()[-500:]}")

            def start_load(seconds: float) -> Load:
                secs = max(1, int(round(seconds)))
                if sysbench:
                    return Load("sysbench", [[sysbench, sysbench_test, *sb_common, f"--threads={connections}",
                                              f"--time={secs}", "run"]], secs, workdir, self_limited=True)
                # No sysbench: connections each busy for at most the load's duration.
                query = f"SET STATEMENT max_statement_time={secs} FOR SELECT BENCHMARK(1000000000, MD5('x'))"
                argv_c = [client, "--no-defaults", "-h", LOOPBACK, "-P", str(port), "-usb", "-psb", "-e", query]
                return Load("mariadb-client", [argv_c] * connections, secs, workdir, self_limited=True)

            yield RunningServer("mariadb", _version([binary, "--version"]), proc.pid, port, workdir, start_load,
                                extra={"socket": sock, "client": client})


# ---- a JVM service --------------------------------------------------------------------------------

JVM_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "jvm")


@contextlib.contextmanager
def jvm_service(pool_threads: int = 4, clients: int = 4, jvm_args: Sequence[str] = ()) -> Iterator[RunningServer]:
    """tests/jvm/TrainingService.java (default-jdk-headless) on a free loopback port: an HTTP
    server with a "req-handler-N" pool and a CPU-heavy "report-builder" thread in the same
    process, Parallel GC (GC Thread#N); load = tests/jvm/http_load.py, ``clients`` keep-alive clients."""
    java = require("java", "default-jdk-headless")
    require("javac", "default-jdk-headless")
    port = free_port()
    with _workdir("jvm", None) as workdir:
        # nodelay: the JDK server writes headers and body apart; with Nagle and the client's delayed
        # ACK every request would wait 40 ms for the network stack, not for the service.
        argv = [java, "-Xmx64m", "-XX:+UseParallelGC", "-Dsun.net.httpserver.nodelay=true", *jvm_args,
                os.path.join(JVM_DIR, "TrainingService.java"),
                str(port), str(pool_threads)]
        with _supervised(argv, os.path.join(workdir, "java.log"), None, cwd=workdir) as proc:
            wait_for_port(port, proc, "TrainingService", timeout=60)

            def start_load(seconds: float) -> Load:
                return Load("http_load", [[sys.executable, os.path.join(JVM_DIR, "http_load.py"), str(port),
                                           str(seconds), str(clients)]], seconds, workdir, self_limited=True)

            yield RunningServer("jvm-service", _version([java, "-version"]), proc.pid, port, workdir, start_load)


# ---- ONNX Runtime (PyPI) ---------------------------------------------------------------------------

ML_WORKER = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench", "ml_worker.py")
# A Python with onnxruntime, onnx and numpy from PyPI (no Debian package has them): $TEMPERD_ML_PYTHON,
# else the .venv-ml that scripts/test.sh makes.
ML_PYTHON = os.environ.get("TEMPERD_ML_PYTHON") or os.path.join(os.path.dirname(ML_WORKER), "..", ".venv-ml", "bin",
                                                                 "python")


@contextlib.contextmanager
def onnx_worker() -> Iterator[RunningServer]:
    """bench/ml_worker.py onnx: ONNX Runtime (CPU provider, default intra-op threads, left unnamed:
    every thread's comm is the interpreter's) serving inferences on loopback; load = its client."""
    python = os.path.abspath(ML_PYTHON)
    if not os.access(python, os.X_OK):
        raise ServerUnavailable(f"no Python with onnxruntime at {python} (scripts/test.sh makes .venv-ml "
                                f"from PyPI; or set TEMPERD_ML_PYTHON)")
    probe = subprocess.run([python, "-c", "import onnxruntime, onnx, numpy; print(onnxruntime.__version__)"],
                           capture_output=True, text=True, timeout=120)
    if probe.returncode != 0:
        raise ServerUnavailable(f"{python} cannot import onnxruntime, onnx and numpy: {probe.stderr.strip()[-200:]}")
    port = free_port()
    with _workdir("onnx", None) as workdir:
        with _supervised([python, ML_WORKER, "onnx", "--port", str(port)], os.path.join(workdir, "onnx.log"), None,
                         cwd=workdir) as proc:
            wait_for_port(port, proc, "ml_worker onnx", timeout=120)

            def start_load(seconds: float) -> Load:
                secs = max(1, int(round(seconds)))
                return Load("ml_worker client", [[python, ML_WORKER, "client", "--port", str(port), "--seconds",
                                                  str(secs)]], secs, workdir, self_limited=True)

            yield RunningServer("onnxruntime", f"onnxruntime {probe.stdout.strip()}", proc.pid, port, workdir,
                                start_load)


def mariadb_thread_roles(server: RunningServer) -> Dict[int, str]:
    """tid -> performance_schema.threads NAME (e.g. thread/sql/one_connection) of a running mariadbd."""
    out = _mariadb_client(server.extra["socket"], "SELECT THREAD_OS_ID, NAME FROM performance_schema.threads "
                                                  "WHERE THREAD_OS_ID IS NOT NULL", server.extra["client"])
    roles: Dict[int, str] = {}
    for line in out.splitlines():
        tid, _, name = line.partition("\t")
        if tid.strip().isdigit():
            roles[int(tid)] = name.strip()
    return roles


def version_tuple(version_line: str) -> Tuple[int, ...]:
    """The first dotted number in a version line, e.g. 'mariadbd  Ver 10.11.19-MariaDB...' -> (10, 11, 19)."""
    match = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", version_line)
    if not match:
        return ()
    return tuple(int(part) for part in match.groups() if part is not None)


__all__ = [
    "Load",
    "LoadResult",
    "Observation",
    "RunningServer",
    "ServerUnavailable",
    "child_pids",
    "cpu_ms_by_name",
    "free_port",
    "jvm_service",
    "mariadb_server",
    "mariadb_thread_roles",
    "onnx_worker",
    "memcached_server",
    "postgresql_bindir",
    "postgresql_server",
    "process_title",
    "redis_cli",
    "redis_server",
    "sample_until",
    "start_parallel_query",
    "thread_names",
    "thread_runtimes",
    "version_tuple",
]
