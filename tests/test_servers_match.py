"""Real servers from the distribution's packages, matched by the real inventory and matcher to their
builtin profiles, with the right threads (and, for PostgreSQL, processes) in the right groups."""

from __future__ import annotations

import contextlib
import time

import pytest

import servers as S
from temperd.config.daemon_config import DaemonConfig
from temperd.sources.inventory import Inventory
from temperd.decide.matcher import Matcher
from temperd.config.profileset import load_builtin_profiles

pytestmark = pytest.mark.servers


@contextlib.contextmanager
def started(factory, **kwargs):
    try:
        with factory(**kwargs) as server:
            yield server
    except S.ServerUnavailable as exc:
        pytest.skip(str(exc))


def match_now():
    inventory = Inventory()
    inventory.reconcile()
    matcher = Matcher(DaemonConfig(), {p.id: p for p in load_builtin_profiles()})
    return inventory, matcher.match(inventory.processes.values())


def groups_by_name(workload):
    out = {}
    for thread in workload.threads:
        out.setdefault(thread.comm, set()).add(thread.group)
    return out


def test_memcached_threads_land_in_their_groups():
    with started(S.memcached_server, threads=4) as server:
        _, result = match_now()
        workload = result.workload_of(server.pid)
    assert workload is not None and workload.profile_id == "memcached"
    assert "memcached" in workload.reason
    groups = groups_by_name(workload)
    assert groups["mc-worker"] == {"workers"}
    assert len(workload.members("workers")) == 4
    assert groups["memcached"] == {"dispatch"}
    assert groups["mc-lrumaint"] == {"maintenance"}


def test_redis_event_loop_and_background_threads_land_in_their_groups():
    with started(S.redis_server, io_threads=2) as server:
        _, result = match_now()
        workload = result.workload_of(server.pid)
    assert workload is not None and workload.profile_id == "redis"
    groups = groups_by_name(workload)
    assert groups["redis-server"] == {"event-loop"}
    assert groups["io_thd_1"] == {"event-loop"}
    background = [name for name in groups if name.startswith(("bio_", "jemalloc"))]
    assert background and all(groups[name] == {"background"} for name in background)


def test_postgresql_processes_form_one_workload_with_backends_by_title():
    with started(S.postgresql_server) as server:
        load = server.start_load(3)
        try:
            deadline = time.monotonic() + 5
            while True:
                inventory, result = match_now()
                workload = result.workload_of(server.pid)
                backends = [t for t in workload.threads if t.group == "backends"] if workload else []
                if len(backends) >= 2 or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            titles = {t.pid: inventory.process(t.pid).title for t in workload.threads}
        finally:
            load.wait()
    assert workload.profile_id == "postgresql"
    assert workload.key.startswith("postgresql:pid") and server.pid in workload.pids
    assert len(workload.pids) >= 5, "postmaster and its background processes are one workload"
    assert len(backends) >= 2, titles
    for thread in backends:
        assert "127.0.0.1(" in titles[thread.pid] or "[local]" in titles[thread.pid], titles[thread.pid]
    by_title = {titles[t.pid].split(": ", 2)[-1]: t.group for t in workload.threads}
    assert by_title.get("checkpointer") == "maintenance"
    assert by_title.get("background writer") == "maintenance"
    assert by_title.get("walwriter") == "wal"
