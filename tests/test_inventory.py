"""The inventory with real processes and threads, named at the OS level, kept current by events
and repaired by scans."""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import select
import shutil
import signal
import subprocess
import sys
import time

import pytest

from driven import spawn_at_pid
from temperd.sources import procfs
from temperd.sources.facts import system_unit_of, unit_from_cgroup
from temperd.sources.changes import EXEC, EXIT, NEW_PROCESS, NEW_THREAD, RENAME, REUSED, UPDATE, Change
from temperd.sources.inventory import Inventory
from temperd.sources.proc_connector import ConnectorUnavailable, ProcConnector
from thread_children import wait_until

class Recorder:
    def __init__(self):
        self.changes = []

    def __call__(self, changes):
        self.changes.extend(changes)

    def has(self, kind, pid, tid=None, **fields):
        for change in self.changes:
            if (change.kind, change.pid, change.tid) == (kind, pid, tid) and all(
                getattr(change, key) == value for key, value in fields.items()
            ):
                return True
        return False


@pytest.fixture
def live():
    """An inventory fed by process events, and a recorder of what it reported."""
    inventory = Inventory()
    if not inventory.start():
        inventory.close()
        pytest.skip(f"process events unavailable here: {inventory.unavailable_reason}")
    recorder = Recorder()
    inventory.subscribe(recorder)
    yield inventory, recorder
    inventory.close()


def pump_until(inventory: Inventory, predicate, timeout: float = 2.0) -> bool:
    """Handle events as they come until predicate() holds; False after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        if inventory.events_active:
            select.select([inventory], [], [], 0.02)
            inventory.handle_events()
        else:
            time.sleep(0.02)


def truth_threads(pid: int) -> dict:
    """tid -> name straight from /proc, read independently of procfs."""
    result = {}
    for name in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{name}/comm") as f:
                result[int(name)] = f.read().rstrip("\n")
        except FileNotFoundError:
            pass
    return result


def own_cgroup_v2() -> str:
    with open("/proc/self/cgroup") as f:
        for line in f:
            if line.startswith("0::"):
                return line[3:].rstrip("\n")
    return ""


# -- events ---------------------------------------------------------------------------------


def test_new_process_appears_with_its_facts(live, spawn):
    inventory, recorder = live
    child = spawn("tmpd-proc")
    assert pump_until(inventory, lambda: getattr(inventory.process(child.pid), "name", None) == "tmpd-proc")
    info = inventory.process(child.pid)
    assert recorder.has(NEW_PROCESS, child.pid)
    assert info.exe == os.path.realpath(sys.executable)
    assert info.cmdline[0] == sys.executable and info.cmdline[-1] == "tmpd-proc"
    assert info.ppid == os.getpid()
    assert info.cgroup == own_cgroup_v2()
    assert not info.is_kernel_thread
    leader = info.threads[child.pid]
    assert leader.comm == "tmpd-proc" and leader.pid == child.pid
    assert leader.affinity == frozenset(os.sched_getaffinity(child.pid))
    assert leader.nice == os.getpriority(os.PRIO_PROCESS, child.pid)
    assert leader.policy == os.sched_getscheduler(child.pid)
    assert info.start_time == procfs.read_task_stat(child.pid, child.pid).start_time


def test_new_thread_rename_and_thread_exit(live, spawn):
    inventory, recorder = live
    child = spawn("tmpd-threads")
    child.wait_ready()
    # Known first, so that the thread comes as a thread of its own and not with a new process.
    assert pump_until(inventory, lambda: getattr(inventory.process(child.pid), "name", None) == "tmpd-threads")
    tid = int(child.command("thread tmpd-w1"))
    assert pump_until(inventory, lambda: getattr(inventory.thread(tid), "comm", None) == "tmpd-w1")
    thread = inventory.thread(tid)
    assert thread.pid == child.pid and thread.tid == tid
    assert recorder.has(NEW_THREAD, child.pid, tid)
    assert inventory.snapshot().thread(tid) == thread

    # Renamed from another thread with pthread_setname_np, as servers name their pools.
    assert child.command(f"rename {tid} tmpd-w2") == "0"
    assert pump_until(inventory, lambda: inventory.thread(tid).comm == "tmpd-w2")
    assert recorder.has(RENAME, child.pid, tid, comm="tmpd-w2", old_comm="tmpd-w1")
    assert inventory.process(child.pid).threads[tid].comm == "tmpd-w2"

    assert child.command(f"stop {tid}") == "ok"
    assert pump_until(inventory, lambda: inventory.thread(tid) is None)
    assert recorder.has(EXIT, child.pid, tid)
    assert inventory.process(child.pid) is not None


def test_process_exit_removes_it_and_its_threads(live, spawn):
    inventory, recorder = live
    child = spawn()
    child.wait_ready()
    tid = int(child.command("thread tmpd-w"))
    assert pump_until(inventory, lambda: inventory.thread(tid) is not None)
    child.close()
    assert pump_until(inventory, lambda: inventory.process(child.pid) is None)
    assert recorder.has(EXIT, child.pid)
    assert inventory.thread(tid) is None and inventory.thread(child.pid) is None
    assert child.pid not in inventory.snapshot().processes


def test_exec_is_reported_and_rereads_the_process(live):
    inventory, recorder = live
    script = "import sys; sys.stdin.readline(); import os; os.execv('/bin/sleep', ['/bin/sleep', '5'])"
    child = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE)
    try:
        assert pump_until(inventory, lambda: getattr(inventory.process(child.pid), "exe", None)
                          == os.path.realpath(sys.executable))
        child.stdin.write(b"go\n")
        child.stdin.flush()
        assert pump_until(inventory, lambda: inventory.process(child.pid).exe == os.path.realpath("/bin/sleep"))
        info = inventory.process(child.pid)
        assert recorder.has(EXEC, child.pid)
        assert info.cmdline == ("/bin/sleep", "5") and info.name == "sleep"
    finally:
        child.kill()
        child.wait()


def test_leader_thread_exit_leaves_the_process(live, spawn):
    inventory, recorder = live
    child = spawn("tmpd-leader")
    child.wait_ready()
    assert pump_until(inventory, lambda: getattr(inventory.process(child.pid), "name", None) == "tmpd-leader")
    survivor = int(child.command("leader-exit"))
    assert pump_until(inventory, lambda: inventory.thread(child.pid) is None
                      and getattr(inventory.thread(survivor), "comm", None) == "tmpd-survivor")
    assert recorder.has(EXIT, child.pid, child.pid) and not recorder.has(EXIT, child.pid)
    assert child.pid not in inventory.process(child.pid).threads

    # Scans agree: the zombie leader is not a live thread; exe and cmdline come through the survivor.
    assert Change(EXIT, child.pid) not in inventory.reconcile().changes
    assert inventory.thread(child.pid) is None
    fresh = Inventory()
    fresh.reconcile()
    scanned = fresh.process(child.pid)
    assert set(scanned.threads) == {survivor}
    assert scanned.exe == os.path.realpath(sys.executable) and scanned.cmdline[-1] == "tmpd-leader"

    child.proc.stdin.write("go\n")
    child.proc.stdin.flush()
    assert pump_until(inventory, lambda: inventory.process(child.pid) is None)
    assert recorder.has(EXIT, child.pid)


def test_title_set_after_a_fork_without_exec_is_picked_up(spawn):
    inventory = Inventory(title_rechecks_s=(0.3,))
    if not inventory.start():
        pytest.skip(f"process events unavailable here: {inventory.unavailable_reason}")
    recorder = Recorder()
    inventory.subscribe(recorder)
    try:
        child = spawn("tmpd-prefork")
        child.wait_ready()
        assert pump_until(inventory, lambda: getattr(inventory.process(child.pid), "name", None) == "tmpd-prefork")
        reconciles = inventory.stats.reconciles
        forked = int(child.command("fork tmpd-pg: backend 127.0.0.1 idle"))
        assert pump_until(inventory, lambda: getattr(inventory.process(forked), "name", None) == "tmpd-forked")
        assert inventory.process(forked).cmdline[-1] == "tmpd-prefork"  # the parent's, as forked
        assert 0 < inventory.poll_timeout() <= 0.3  # a title recheck is pending
        os.kill(forked, signal.SIGUSR1)
        assert pump_until(inventory, lambda: inventory.process(forked).title == "tmpd-pg: backend 127.0.0.1 idle")
        assert recorder.has(UPDATE, forked)
        assert inventory.stats.reconciles == reconciles  # found without a scan
    finally:
        inventory.close()


def test_vanishing_tasks_are_counted_not_logged(live, caplog):
    inventory, _ = live
    caplog.set_level(logging.DEBUG, logger="temperd")
    pids = []
    for _ in range(20):
        proc = subprocess.Popen(["/bin/true"])
        pids.append(proc.pid)
        proc.wait()
    assert pump_until(inventory, lambda: False, timeout=0.3) is False
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert not any(pid in inventory.processes for pid in pids)
    assert inventory.stats.vanished > 0  # most were gone before their fork event was handled


# -- pid reuse ------------------------------------------------------------------------------

def test_pid_reuse_found_by_a_scan(spawn):
    inventory = Inventory()  # scanning only: no exit event tells it the old process is gone
    old_child = spawn("tmpd-old")
    old_child.wait_ready()
    time.sleep(0.03)  # start times are in clock ticks: make sure the two differ
    inventory.reconcile()
    old = inventory.process(old_child.pid)
    assert old.name == "tmpd-old"
    old_child.close()

    new_child = spawn_at_pid(spawn, old.pid, "tmpd-new")
    new_child.wait_ready()
    summary = inventory.reconcile()
    assert Change(REUSED, old.pid) in summary.changes
    new = inventory.process(old.pid)
    assert new.name == "tmpd-new" and new.start_time > old.start_time


def test_pid_reuse_found_when_the_exit_event_is_lost(live, spawn):
    inventory, _ = live
    old_child = spawn("tmpd-old")
    old_child.wait_ready()
    time.sleep(0.03)
    assert pump_until(inventory, lambda: getattr(inventory.process(old_child.pid), "name", None) == "tmpd-old")
    pid = old_child.pid
    old_start = inventory.process(pid).start_time
    old_child.close()
    new_child = spawn_at_pid(spawn, pid, "tmpd-new")
    new_child.wait_ready()

    # Apply the real events, less the old process's exit, as if it had been lost.
    changes = []
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline and getattr(inventory.process(pid), "name", None) != "tmpd-new":
        select.select([inventory], [], [], 0.02)
        for event in inventory.connector.drain().events:
            if not (event.kind == "exit" and event.pid == pid):
                inventory.apply_event(event, changes)
    assert Change(REUSED, pid) in changes
    assert inventory.process(pid).start_time > old_start


# -- lost events ----------------------------------------------------------------------------


def test_overflowed_events_are_repaired_by_a_rescan(spawn):
    inventory = Inventory(rcvbuf_bytes=1, resync_min_interval_s=0)  # the kernel's minimum: a handful of events
    if not inventory.start():
        pytest.skip(f"process events unavailable here: {inventory.unavailable_reason}")
    try:
        child = spawn()
        child.wait_ready()
        kept = int(child.command("thread tmpd-keep"))
        gone = int(child.command("thread tmpd-gone"))
        assert pump_until(inventory, lambda: inventory.thread(gone) is not None
                          and inventory.thread(kept) is not None)
        reconciles = inventory.stats.reconciles

        burst = [int(t) for t in child.command("burst 150 tmpd-b").split()]
        child.command(f"rename {kept} tmpd-kept")
        child.command(f"stop {gone}")
        # The child's join returns as the thread ends, a moment before the kernel drops its task:
        # a rescan in that moment still finds it (and its exit event was lost in the overflow).
        assert wait_until(lambda: not os.path.exists(f"/proc/{child.pid}/task/{gone}"), 5)
        inventory.handle_events()

        stats = inventory.stats
        assert stats.events_lost >= 1, "the burst did not overflow the receive buffer"
        assert stats.reconciles > reconciles and not inventory.needs_reconcile
        truth = truth_threads(child.pid)
        known = {tid: info.comm for tid, info in inventory.process(child.pid).threads.items()}
        assert known == truth
        assert set(burst) <= set(known) and known[kept] == "tmpd-kept" and gone not in known
    finally:
        inventory.close()


def test_changes_while_the_socket_was_closed_are_found_by_reconcile(live, spawn):
    inventory, recorder = live
    child = spawn()
    child.wait_ready()
    renamed = int(child.command("thread tmpd-a"))
    stopped = int(child.command("thread tmpd-c"))
    assert pump_until(inventory, lambda: inventory.thread(stopped) is not None)

    inventory.stop_events()
    added = int(child.command("thread tmpd-b"))
    child.command(f"rename {renamed} tmpd-a2")
    child.command(f"stop {stopped}")
    short = subprocess.Popen(["/bin/sleep", "5"])
    try:
        summary = inventory.reconcile()
    finally:
        short.kill()
        short.wait()
    changes = summary.changes
    assert Change(NEW_THREAD, child.pid, added, comm="tmpd-b") in changes
    assert Change(RENAME, child.pid, renamed, comm="tmpd-a2", old_comm="tmpd-a") in changes
    assert Change(EXIT, child.pid, stopped) in changes
    assert Change(NEW_PROCESS, short.pid) in changes
    assert recorder.has(RENAME, child.pid, renamed, comm="tmpd-a2")
    assert {t: i.comm for t, i in inventory.process(child.pid).threads.items()} == truth_threads(child.pid)
    assert inventory.reconcile().count(EXIT) >= 1  # the sleep is gone now
    assert inventory.start_events()


# -- fallback -------------------------------------------------------------------------------


def test_fallback_to_scanning_with_one_notice(monkeypatch, caplog, spawn):
    def refuse(self, ack_timeout_s=1.0):
        raise ConnectorUnavailable("subscribing to process events needs CAP_NET_ADMIN")

    monkeypatch.setattr(ProcConnector, "open", refuse)
    caplog.set_level(logging.INFO, logger="temperd.sources.inventory")
    inventory = Inventory()
    assert inventory.start() is False
    assert inventory.start_events() is False
    notices = [r for r in caplog.records if r.name == "temperd.sources.inventory"]
    assert len(notices) == 1 and "CAP_NET_ADMIN" in notices[0].getMessage()
    assert "falling back to scanning" in notices[0].getMessage()
    with pytest.raises(ValueError):
        inventory.fileno()
    assert inventory.handle_events() == []
    assert inventory.stats.events_active is False

    child = spawn("tmpd-scan")
    child.wait_ready()
    tid = int(child.command("thread tmpd-st"))
    summary = inventory.reconcile()
    assert Change(NEW_PROCESS, child.pid) in summary.changes
    assert inventory.thread(tid).comm == "tmpd-st"
    assert inventory.process(child.pid).name == "tmpd-scan"


def test_fallback_in_a_foreign_pid_namespace():
    """Inside user and pid namespaces (a container) the kernel ignores the subscription; the
    inventory says so and still sees the host's processes by scanning /proc."""
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("util-linux unshare is not installed")
    code = (
        "import json, sys\n"
        "from temperd.sources.inventory import Inventory\n"
        "inv = Inventory(ack_timeout_s=0.3)\n"
        "active = inv.start()\n"
        "me = inv.process(int(sys.argv[1]))\n"
        "print(json.dumps({'active': active, 'reason': inv.unavailable_reason,\n"
        "                  'name': me and me.name, 'affinity': me and sorted(me.threads[me.pid].affinity)}))\n"
    )
    probe = subprocess.run(
        [unshare, "--user", "--map-root-user", "--pid", "--fork", sys.executable, "-c", code, str(os.getpid())],
        capture_output=True, text=True, timeout=30,
    )
    if probe.returncode != 0 and "unshare" in probe.stderr:
        pytest.skip(f"cannot create user and pid namespaces here: {probe.stderr.strip()}")
    assert probe.returncode == 0, probe.stderr
    result = json.loads(probe.stdout)
    assert result["active"] is False and "namespace" in result["reason"]
    assert "falling back to scanning" in probe.stderr
    with open("/proc/self/comm") as f:
        assert result["name"] == f.read().strip()
    assert result["affinity"] == sorted(os.sched_getaffinity(0))


# -- facts ----------------------------------------------------------------------------------


def test_kernel_threads_are_marked():
    inventory = Inventory()
    inventory.reconcile()
    kthreadd = inventory.process(2)
    if kthreadd is None:
        pytest.skip("no kthreadd visible (not in the initial pid namespace)")
    assert kthreadd.is_kernel_thread and kthreadd.exe is None and kthreadd.cmdline == ()
    children = [p for p in inventory.processes.values() if p.ppid == 2]
    assert children and all(p.is_kernel_thread for p in children)
    assert not inventory.process(os.getpid()).is_kernel_thread


def test_environment_variable_read_on_demand(spawn):
    env = dict(os.environ, TEMPER_WORKLOAD_PROFILE="memcached-demo")
    child = spawn(env=env)
    child.wait_ready()
    assert procfs.read_environ_var(child.pid, "TEMPER_WORKLOAD_PROFILE") == "memcached-demo"
    assert procfs.read_environ_var(child.pid, "TEMPER_NOT_SET") is None
    child.close()
    assert procfs.read_environ_var(child.pid, "TEMPER_WORKLOAD_PROFILE") is None


def test_rewritten_process_title_is_normalised_and_reported(spawn):
    inventory = Inventory()
    child = spawn("tmpd-pg")
    child.wait_ready()
    inventory.reconcile()
    assert inventory.process(child.pid).cmdline[-1] == "tmpd-pg"
    assert child.command("title tmpd-pg: walwriter") == "ok"
    summary = inventory.reconcile()
    assert Change(UPDATE, child.pid) in summary.changes
    info = inventory.process(child.pid)
    assert info.cmdline == ("tmpd-pg: walwriter",) and info.title == "tmpd-pg: walwriter"


def test_refresh_runtime_reads_cpu_time_of_selected_processes(spawn):
    inventory = Inventory()
    child = spawn()
    child.wait_ready()
    idle = int(child.command("thread tmpd-idle"))
    busy = int(child.command("spin tmpd-busy"))
    inventory.reconcile()
    assert inventory.thread(busy).runtime_ns is None  # not sampled by scans
    inventory.refresh_runtime([child.pid])
    busy_ns, idle_ns = inventory.thread(busy).runtime_ns, inventory.thread(idle).runtime_ns
    assert busy_ns >= 40_000_000 and busy_ns > idle_ns
    with open(f"/proc/{child.pid}/task/{busy}/schedstat") as f:
        assert busy_ns <= int(f.read().split()[0])


def test_snapshot_is_immutable_and_cached(live, spawn):
    inventory, _ = live
    child = spawn()
    child.wait_ready()
    assert pump_until(inventory, lambda: inventory.process(child.pid) is not None)
    first = inventory.snapshot()
    assert inventory.snapshot() is first
    with pytest.raises(TypeError):
        first.processes[child.pid] = None
    with pytest.raises(TypeError):
        first.process(child.pid).threads[1] = None
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.thread(child.pid).comm = "x"

    tid = int(child.command("thread tmpd-late"))
    assert pump_until(inventory, lambda: inventory.thread(tid) is not None)
    later = inventory.snapshot()
    assert later is not first and later.thread(tid) is not None
    assert first.thread(tid) is None and tid not in first.process(child.pid).threads


def test_stats_count_events_and_reconciles(live, spawn):
    inventory, _ = live
    before = inventory.stats
    child = spawn()
    child.wait_ready()
    assert pump_until(inventory, lambda: inventory.process(child.pid) is not None)
    inventory.reconcile()
    stats = inventory.stats
    assert stats.events_active and stats.events_received > before.events_received
    assert stats.reconciles == before.reconciles + 1
    assert 0 < stats.last_reconcile_cpu_s < 5 and stats.last_reconcile_duration_s > 0
    assert stats.processes == len(inventory.processes)
    assert stats.threads == len(inventory.snapshot().threads)
    assert 0 <= stats.last_event_lag_s <= stats.max_event_lag_s < 5


# -- pure parsing ---------------------------------------------------------------------------


def test_unit_from_cgroup_path():
    assert unit_from_cgroup("/system.slice/memcached.service") == "memcached.service"
    assert unit_from_cgroup("/user.slice/user-1000.slice/session-2.scope") == "session-2.scope"
    assert unit_from_cgroup("/system.slice/app.service/worker") == "app.service"
    assert unit_from_cgroup(
        "/user.slice/user-1000.slice/user@1000.service/app.slice/foo.service") == "foo.service"
    assert unit_from_cgroup("/system.slice") is None
    assert unit_from_cgroup("/") is None
    assert unit_from_cgroup(None) is None


def test_parse_cgroup_on_a_hybrid_host():
    data = (b"12:cpu,cpuacct:/system.slice/redis-server.service\n"
            b"1:name=systemd:/system.slice/redis-server.service\n"
            b"0::/\n")
    paths = procfs.parse_cgroup(data)
    assert (paths.unified, paths.systemd) == ("/", "/system.slice/redis-server.service")
    assert paths.unit == "redis-server.service"  # systemd's own hierarchy names the unit
    assert procfs.parse_cgroup(b"0::/system.slice/memcached.service\n").unit == "memcached.service"


def test_a_login_session_on_a_hybrid_host_is_its_scope_in_user_slice():
    """The unit and whether it is a system unit come from one path: the name=systemd one where
    there is one (the v2 path of a hybrid host can be "/" for every process)."""
    paths = procfs.parse_cgroup(b"9:name=systemd:/user.slice/user-1002.slice/session-9.scope\n0::/\n")
    assert paths.unit == "session-9.scope"
    assert system_unit_of(procfs.systemd_cgroup(paths.unified, paths.systemd)) is None
    # a v2 path that disagrees does not lend its unit
    paths = procfs.parse_cgroup(b"1:name=systemd:/user.slice/user-1002.slice/session-9.scope\n"
                                b"0::/system.slice/memcached.service\n")
    assert paths.unit == "session-9.scope"


def test_which_units_the_system_manager_runs():
    assert system_unit_of("/system.slice/memcached.service") == "memcached.service"
    assert system_unit_of("/system.slice/app.service/worker") == "app.service"
    assert system_unit_of("/machine.slice/vm.scope") == "vm.scope"
    assert system_unit_of("/user.slice/user-1000.slice/session-2.scope") is None
    assert system_unit_of("/user.slice/user-1000.slice/user@1000.service/app.slice/foo.service") is None
    assert system_unit_of("/user.slice/foo.service") is None
    assert system_unit_of("/session-3.scope") is None
    assert system_unit_of("/") is None and system_unit_of(None) is None and system_unit_of("/system.slice") is None


def test_normalise_cmdline():
    assert procfs.normalise_cmdline(b"/usr/bin/memcached\x00-l\x00127.0.0.1\x00") == ("/usr/bin/memcached", "-l", "127.0.0.1")
    assert procfs.normalise_cmdline(b"postgres: checkpointer \0\0\0\0\0\0") == ("postgres: checkpointer",)
    assert procfs.normalise_cmdline(b"postgres: walwriter      ") == ("postgres: walwriter",)
    assert procfs.normalise_cmdline(b"a\0\0b\0") == ("a", "", "b")
    assert procfs.normalise_cmdline(b"") == ()


def test_parse_stat_with_an_awkward_name():
    line = (b"4242 (a) b (c) ) S 1 4242 4242 0 -1 4194560 100 0 0 0 7 3 0 0 20 -5 2 0 123456 "
            b"1000 100 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 3 0 0 0 0 0 0 0 0 0 0 0\n")
    stat = procfs.parse_stat(line)
    assert stat.comm == "a) b (c) " and stat.state == "S" and stat.ppid == 1
    assert (stat.nice, stat.start_time, stat.last_cpu, stat.policy) == (-5, 123456, 1, 3)


def test_a_cgroups_quota_is_read_once_between_scans_and_again_after_one():
    from temperd.sources.process_store import ProcessStore
    from temperd.sources.scan import scan

    reads = []
    store = ProcessStore()
    store.quotas = functools.cache(lambda cgroup: reads.append(cgroup) or 1.5)
    scan(store)
    mine = store.procs[os.getpid()]
    assert mine.on_demand.cpu_quota("/a") == 1.5 and mine.on_demand.cpu_quota("/a") == 1.5
    other = next(proc for pid, proc in store.procs.items() if pid != os.getpid())
    assert other.on_demand.cpu_quota("/a") == 1.5 and reads == ["/a"]  # shared by the processes of one store
    scan(store)  # an operator may have set a quota since
    assert mine.on_demand.cpu_quota("/a") == 1.5 and reads == ["/a", "/a"]


def test_a_process_that_forks_and_execs_within_one_batch_is_read_once_and_one_that_ends_not_at_all(spawn,
                                                                                                     monkeypatch):
    from temperd.sources.proc_connector import Batch, ProcEvent

    inventory = Inventory()  # not started: the batches are given
    reads = []
    real_read = inventory._store.read_process
    monkeypatch.setattr(inventory._store, "read_process", lambda pid, *a, **kw: reads.append(pid) or real_read(pid, *a, **kw))
    execed, ended = spawn("tmpd-execed"), spawn("tmpd-ended")

    def event(kind, pid):
        return ProcEvent(kind, pid, pid, time.monotonic_ns(), 0)

    changes = []
    inventory._apply_batch(Batch(events=[event("fork", execed.pid), event("fork", ended.pid),
                                         event("exec", execed.pid), event("exit", ended.pid)]), changes)
    assert reads == [execed.pid]
    assert [(c.kind, c.pid) for c in changes] == [(NEW_PROCESS, execed.pid)]
    assert inventory.process(execed.pid).pid == execed.pid and inventory.process(ended.pid) is None
    assert inventory.stats.events_received == 4
    assert inventory.poll_timeout() is not None  # the title of the one read at its exec is rechecked later


def test_a_snapshot_made_from_the_last_one_equals_one_made_from_scratch(live, spawn):
    """The snapshot copies the previous one's tables and makes again only the processes changed
    since: after threads come, are renamed and go, and processes come and go, it holds what a
    snapshot built from every process holds."""
    inventory, _ = live
    first, second = spawn(), spawn()
    for child in (first, second):
        child.wait_ready()
    assert pump_until(inventory, lambda: inventory.process(second.pid) is not None)
    before = inventory.snapshot()
    tids = [int(t) for t in first.command("burst 3 tmpd-b").split()]
    first.command(f"rename {tids[0]} tmpd-r")
    first.command(f"stop {tids[1]}")
    second.close()
    assert pump_until(inventory, lambda: inventory.process(second.pid) is None
                      and inventory.thread(tids[1]) is None and inventory.thread(tids[0]) is not None
                      and inventory.thread(tids[0]).comm == "tmpd-r")
    kept = inventory.snapshot()
    # What the matcher is told changed since `before`: every process whose facts differ.
    changed = inventory.changed_since(before.generation)
    differ = {pid for pid in before.processes.keys() | kept.processes.keys()
              if before.processes.get(pid) is not kept.processes.get(pid)}
    assert changed is not None and {first.pid, second.pid} <= differ <= changed
    assert inventory.changed_since(kept.generation) == frozenset() and inventory.changed_since(-1) is None
    store = inventory._store
    store._cached = None
    whole = store.snapshot()
    assert dict(kept.processes) == dict(whole.processes) and dict(kept.threads) == dict(whole.threads)
    assert kept.thread(tids[2]) is not None and second.pid not in kept.processes
