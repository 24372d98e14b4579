"""Evidence for the builtin profiles: the thread names and process titles they rely on really occur.

Each test starts a real server from the distribution's packages on 127.0.0.1, puts a short
bounded load on it, reads /proc/PID/task/*/comm (and the titles of child processes), and checks
that (a) the names the profile's groups select are there, (b) each observed thread or process
lands in the group the profile intends, by the schema's rule (the first group whose name or
title selector matches, else the catch-all), and (c) the profile's fingerprint recognises the
live process. A missing server binary or load tool skips the test with the package to install.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import types
from pathlib import Path
from typing import Iterator, Optional

import pytest

import servers as S
from thread_children import busy_until
from temperd.decide.matcher import fingerprint_reason, selector_reason
from temperd.config.profile import Profile, profile_from_document
from temperd.config.tomlsource import read_toml

pytestmark = pytest.mark.servers

PROFILE_DIR = Path(__file__).resolve().parent.parent / "profiles"
LOAD_S = 2.0
LOAD_BUSY_TICKS = 10  # a tenth of a second of CPU on the server: its load connected and served


def profile(profile_id: str) -> Profile:
    return profile_from_document(read_toml(str(PROFILE_DIR / f"{profile_id}.toml")))


def group_of(prof: Profile, comm: str, title: str = "") -> Optional[str]:
    """The group the matcher puts a thread in by name/title selectors, else the catch-all (None: neither).

    ``busiest`` groups are decided by CPU time and are not evaluated here.
    """
    for group in prof.thread_groups:
        if selector_reason(group, comm, title):
            return group.name
    return next((g.name for g in prof.thread_groups if g.catch_all), None)


def live_process(pid: int) -> types.SimpleNamespace:
    """The facts the matcher's fingerprint check reads, taken from /proc."""
    with open(f"/proc/{pid}/comm", encoding="utf-8") as f:
        name = f.read().strip()
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        cmdline = tuple(a.decode() for a in f.read().rstrip(b"\0").split(b"\0"))
    return types.SimpleNamespace(exe=os.readlink(f"/proc/{pid}/exe"), name=name, cmdline=cmdline,
                                 unit=None, cgroup=None)


@contextlib.contextmanager
def started(factory, *args, **kwargs) -> Iterator[S.RunningServer]:
    try:
        cm = factory(*args, **kwargs)
        server = cm.__enter__()
    except S.ServerUnavailable as exc:
        pytest.skip(str(exc))
    try:
        yield server
    finally:
        cm.__exit__(*sys.exc_info())


def observe_with_cpu(server: S.RunningServer):
    before = S.thread_runtimes(server.pid)
    obs, result = server.observe_load(LOAD_S)
    cpu = S.cpu_ms_by_name(before, S.thread_runtimes(server.pid))
    return obs, result, cpu


# ---- memcached ----------------------------------------------------------------------------------


def test_memcached_worker_and_maintenance_threads():
    prof = profile("memcached")
    with started(S.memcached_server, threads=4) as server:
        idle = S.Observation()
        idle.add_sample(server.pid)
        obs, result, cpu = observe_with_cpu(server)
        assert fingerprint_reason(prof, live_process(server.pid)), "memcached fingerprint does not match"
    assert result.ok, result.output_tail
    assert idle.max_threads["mc-worker"] == 4 and obs.max_threads["mc-worker"] == 4  # one per -t
    expected = {"memcached", "mc-worker", "mc-lrumaint", "mc-slabmaint", "mc-assocmaint", "mc-itemcrawler", "mc-log"}
    assert expected <= set(obs.names), obs.names
    assert cpu["mc-worker"] > 5 * max(cpu.get("mc-lrumaint", 0.0), 1.0), cpu  # the workers carry the load
    assert group_of(prof, "mc-worker") == "workers"
    assert group_of(prof, "memcached") == "dispatch"
    for name in expected - {"mc-worker", "memcached"}:
        assert group_of(prof, name) == "maintenance", name


# ---- redis --------------------------------------------------------------------------------------


def test_redis_event_loop_io_and_background_threads():
    prof = profile("redis")
    with started(S.redis_server, io_threads=2) as server:
        obs, result, cpu = observe_with_cpu(server)
        assert fingerprint_reason(prof, live_process(server.pid)), "redis fingerprint does not match"
        # A BGSAVE child, slowed per key so it lives long enough to be seen; stopping the server kills it.
        S.redis_cli(server, "CONFIG", "SET", "rdb-key-save-delay", "200")
        S.redis_cli(server, "BGSAVE")
        child = S.Observation()
        S.sample_until(server.pid, lambda: bool(child.child_titles), interval=0.05, limit_s=3.0, observation=child)
    assert result.ok, result.output_tail
    assert {"redis-server", "io_thd_1", "bio_close_file", "bio_lazy_free", "jemalloc_bg_thd"} <= set(obs.names), obs.names
    assert any(n.startswith("bio_aof") for n in obs.names), obs.names
    assert cpu["redis-server"] > 0 and cpu["io_thd_1"] > 0, cpu
    for name in ("redis-server", "io_thd_1"):
        assert group_of(prof, name) == "event-loop"
    for name in obs.names:
        if name.startswith(("bio_", "jemalloc")):
            assert group_of(prof, name) == "background", name
    titles = list(child.child_titles)
    assert any(t.startswith("redis-rdb-bgsave ") for t in titles), titles
    assert set(child.child_threads) <= {"redis-server"}  # the child keeps the parent's comm ...
    for title in titles:  # ... so only its title puts it in the yielding group
        assert group_of(prof, "redis-server", title) == "fork-children", title


# ---- PostgreSQL -----------------------------------------------------------------------------------


def test_postgresql_roles_are_in_process_titles():
    prof = profile("postgresql")
    with started(S.postgresql_server) as server:
        obs, result = server.observe_load(LOAD_S)
        parallel = S.start_parallel_query(server, 2.0)
        seen = S.Observation()
        S.sample_until(server.pid, lambda: not parallel.running() or any(
            "parallel worker for PID" in t for t in seen.child_titles), interval=0.05, limit_s=4.0, observation=seen)
        parallel.wait()
        postmaster = live_process(server.pid)
        postmaster_title = S.process_title(server.pid)
        assert fingerprint_reason(prof, postmaster), "postgresql fingerprint does not match"
    assert result.ok, result.output_tail
    # comm says nothing: every process (and thread) is "postgres"
    assert set(obs.child_threads) == {"postgres"} and set(obs.names) == {"postgres"}
    titles = list(obs.child_titles) + list(seen.child_titles)
    prefix = f"postgres: {server.extra['cluster_name']}: "
    roles = {t[len(prefix):] for t in titles if t.startswith(prefix)}
    for role in ("checkpointer", "background writer", "walwriter", "autovacuum launcher"):
        assert role in roles, sorted(roles)
    intended = {"checkpointer": "maintenance", "background writer": "maintenance", "walwriter": "wal",
                "autovacuum launcher": "maintenance", "logical replication launcher": "maintenance"}
    backends = [t for t in titles if re.search(r" 127\.0\.0\.1\(\d+\) ", t)]
    workers = [t for t in titles if "parallel worker for PID" in t]
    assert backends, titles
    assert workers, titles
    for title in titles:
        role = title[len(prefix):]
        want = intended.get(role, "backends" if title in backends or title in workers else None)
        if want is None:
            continue  # transient roles (autovacuum worker ...) are covered by the pattern tests below
        assert group_of(prof, "postgres", title) == want, title
        # the same role without a cluster_name prefix (clusters that do not set one)
        assert group_of(prof, "postgres", "postgres: " + role) == want, role
    assert group_of(prof, "postgres", postmaster_title) == "postmaster", postmaster_title


# ---- MariaDB ---------------------------------------------------------------------------------------


def test_mariadb_connection_threads_by_version():
    prof = profile("mysql-innodb")
    with started(S.mariadb_server) as server:
        load = server.start_load(LOAD_S)
        busy_until(server.pid, LOAD_BUSY_TICKS)  # sysbench connected and busy
        roles = S.mariadb_thread_roles(server)
        names = S.thread_names(server.pid)
        load_result = load.wait()
        assert fingerprint_reason(prof, live_process(server.pid)), "mysql-innodb fingerprint does not match"
    assert load_result.ok, load_result.output_tail
    connections = [tid for tid, role in roles.items() if role == "thread/sql/one_connection" and tid in names]
    assert len(connections) >= 4, roles  # four sysbench clients (+ the role query's own session)
    cleaners = [tid for tid, role in roles.items() if role.startswith("thread/innodb/page_cleaner") and tid in names]
    assert cleaners, roles
    yielding = {g.name for g in prof.thread_groups if g.treatment == "yield"}
    if S.version_tuple(server.version) < (11,):
        # MariaDB 10.x does not name threads: all are "mariadbd" (io_uring workers aside) ...
        assert {n for n in names.values() if not n.startswith("iou-wrk-")} == {"mariadbd"}, names
        # ... so they share one group, and it must not be a yielding one.
        assert group_of(prof, "mariadbd") == "unnamed"
        assert "unnamed" not in yielding
    else:
        assert {names[tid] for tid in connections} == {"one_connection"}
        assert group_of(prof, "one_connection") == "connections"
        assert {names[tid] for tid in cleaners} == {"page_cleaner"}
        assert group_of(prof, "page_cleaner") == "innodb-io"
    for tid in connections:
        assert group_of(prof, names[tid]) not in yielding


# ---- JVM -------------------------------------------------------------------------------------------

JAVA_PROGRAM = """
import java.util.concurrent.*;
import java.util.concurrent.atomic.AtomicInteger;
public class Pools {
    static ExecutorService pool(String prefix, int n) {
        AtomicInteger i = new AtomicInteger();
        return Executors.newFixedThreadPool(n, r -> new Thread(r, prefix + i.incrementAndGet()));
    }
    public static void main(String[] args) throws Exception {
        ExecutorService[] pools = {pool("http-nio-8080-exec-", 2), pool("qtp1706234378-", 2),
                                   pool("nioEventLoopGroup-2-", 2), Executors.newFixedThreadPool(1)};
        for (int round = 0; round < 50; round++)
            for (ExecutorService p : pools) p.submit(() -> new byte[1 << 16].length);
        System.gc();
        System.out.println("READY");
        System.out.flush();
        Thread.sleep(Long.parseLong(args[0]));
        for (ExecutorService p : pools) p.shutdownNow();
    }
}
"""


def test_jvm_thread_names_truncated_to_15_bytes(tmp_path):
    java, javac = shutil.which("java"), shutil.which("javac")
    if not java or not javac:
        pytest.skip("java/javac not found (Debian package default-jdk-headless)")
    prof = profile("jvm-service")
    (tmp_path / "Pools.java").write_text(JAVA_PROGRAM)
    subprocess.run([javac, "Pools.java"], cwd=tmp_path, check=True, timeout=120)
    proc = subprocess.Popen([java, "-XX:+UseG1GC", "-XX:ParallelGCThreads=2", "-Xmx64m", "-cp", str(tmp_path),
                             "Pools", "3000"], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "READY"
        names = set(S.thread_names(proc.pid).values())
        facts = live_process(proc.pid)
    finally:
        proc.kill()
        proc.wait(10)
    assert fingerprint_reason(prof, facts), facts
    # The kernel keeps 15 bytes of each Java thread name.
    assert {"http-nio-8080-e", "qtp1706234378-1", "nioEventLoopGro", "pool-1-thread-1"} <= names, names
    assert {"VM Thread", "GC Thread#0", "C2 CompilerThre", "G1 Conc#0", "G1 Refine#0"} <= names, names
    intended = {"http-nio-8080-e": "requests", "qtp1706234378-1": "requests", "nioEventLoopGro": "requests",
                "VM Thread": "safepoint", "GC Thread#0": "safepoint", "G1 Conc#0": "concurrent-gc",
                "G1 Main Marker": "concurrent-gc", "C2 CompilerThre": "jit-housekeeping",
                "C1 CompilerThre": "jit-housekeeping", "Finalizer": "jit-housekeeping",
                "java": "application", "pool-1-thread-1": "application"}
    for name, group in intended.items():
        if name in names:
            assert group_of(prof, name) == group, name
    # every thread lands in some group; only the listed background names yield
    for name in names:
        group = group_of(prof, name)
        assert group is not None
        if prof.group(group).treatment == "yield":
            assert name.startswith(("G1 ", "C1 ", "C2 ", "Z", "Shenandoah")) or name in prof.group(group).thread_names, name
