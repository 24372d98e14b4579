"""The candidate index (decide/candidates.py) and the inventory's light processes (sources/light.py,
sources/tracking.py): a process nothing can match costs its leader's stat and what the index
asks for, no thread read and no change (so no replan); one that renames or execs into a
candidate, or descends from a tracked one, is tracked."""

from __future__ import annotations

import os
import select
import struct
import subprocess
import time
from types import SimpleNamespace

import pytest

from temperd.config.daemon_config import Binding, DaemonConfig
from temperd.config.profile import Fingerprint, Profile, ThreadGroup
from temperd.decide.candidates import CandidateIndex
from temperd.decide.trust import TrustPolicy
from temperd.sources import procfs, proc_connector
from temperd.sources.changes import NEW_PROCESS
from temperd.sources.inventory import Inventory
from temperd.sources.proc_connector import Batch, ProcConnector, ProcEvent

TRUST = TrustPolicy(uid_min=1000)


def profile(pid: str = "p", **fingerprint) -> Profile:
    return Profile(id=pid, description="", fingerprint=Fingerprint(**fingerprint), machine_shape=None,
                   traits=None, thread_groups=(ThreadGroup(name="g", thread_names=("w-*",), treatment="yield"),),
                   source="test")


def index(*profiles, bindings=(), bound=()) -> CandidateIndex:
    return CandidateIndex(list(profiles), DaemonConfig(bindings=tuple(bindings)), TRUST, bound)


class FakeProbe:
    """What the index may ask of a process, each read counted."""

    def __init__(self, comm="x", exe="/bin/x", unit=None, cgroup="/user.slice", cmdline=("x",), uid=1000, env=None):
        self.pid, self.comm, self.uid = 4242, comm, uid
        self.system_unit = unit
        self.asked = []
        self._exe, self._cmdline, self._env = exe, cmdline, env or {}
        self._cgroup = SimpleNamespace(unified=cgroup, systemd=None, unit=unit)

    def exe(self):
        self.asked.append("exe")
        return self._exe

    def cgroup(self):
        self.asked.append("cgroup")
        return self._cgroup

    def cmdline(self):
        self.asked.append("cmdline")
        return self._cmdline

    def environ(self, name):
        self.asked.append("environ")
        return self._env.get(name)


def test_the_index_reads_only_what_some_profile_or_binding_needs():
    assert index(profile(process_names=("mc*",))).reads() == ["environ"]
    assert index(profile(executables=("/usr/bin/mc",))).reads() == ["exe", "environ"]
    assert index(profile(units=("mc.service",))).reads() == ["cgroup", "environ"]
    assert index(profile(process_names=("a",)), bindings=[Binding(tier="background", cgroup="/x")]).reads() == \
        ["cgroup", "environ"]
    assert index(profile(cmdline=(r"\.gguf",))).reads() == ["cmdline", "environ"]
    assert index().reads() == []  # no profile: nothing for the marker to name, no binding


def test_the_index_checks_cheapest_first_and_stops_at_the_first_hit():
    idx = index(profile(process_names=("mc*",), executables=("*/mc",), units=("mc.service",), cmdline=("--mc",)))
    by_name = FakeProbe(comm="mcd")
    assert idx.wants(by_name) and by_name.asked == []  # the name is in the stat already read
    by_exe = FakeProbe(exe="/opt/mc")
    assert idx.wants(by_exe) and by_exe.asked == ["exe"]
    by_unit = FakeProbe(unit="mc.service")
    assert idx.wants(by_unit) and by_unit.asked == ["exe", "cgroup"]
    by_cmdline = FakeProbe(cmdline=("run", "--mc"))
    assert idx.wants(by_cmdline) and by_cmdline.asked == ["exe", "cgroup", "cmdline"]
    nothing = FakeProbe()
    assert idx.wants(nothing) is None and nothing.asked == ["exe", "cgroup", "cmdline"]  # untrusted: no environ


def test_the_environment_marker_is_read_for_trusted_owners_only():
    idx = index(profile(process_names=("mc",)))
    marked = {"TEMPER_WORKLOAD_PROFILE": "p"}
    assert idx.wants(FakeProbe(uid=0, env=marked))
    assert idx.wants(FakeProbe(uid=998, env=marked))  # a system account
    assert idx.wants(FakeProbe(uid=1000, unit="app.service", env=marked))  # a system unit
    user = FakeProbe(uid=1000, env=marked)
    assert idx.wants(user) is None and "environ" not in user.asked
    assert idx.wants(FakeProbe(uid=0)) is None  # trusted, no marker


def test_a_runtime_binding_makes_its_pid_a_candidate():
    assert index(profile(process_names=("mc",)), bound=[4242]).wants(FakeProbe()) == "a runtime binding names it"


class FakeSocket:
    def __init__(self):
        self.sent = []

    def send(self, data):
        self.sent.append(data)


def _payload(message: bytes) -> bytes:
    return message[16 + 20:]


def _subscribed(monkeypatch, release):
    monkeypatch.setattr(proc_connector, "kernel_release", lambda: release)
    monkeypatch.setattr(ProcConnector, "_wait_for_ack", lambda self, sock, cookie, timeout: None)
    connector, sock = ProcConnector(), FakeSocket()
    connector._subscribe(sock, 1.0)
    return connector, sock


def _datagram(what: int, pid: int) -> bytes:
    data = struct.pack("=IIQ", what, 0, time.monotonic_ns()) + struct.pack("=ii", pid, pid) + bytes(16)
    cn = struct.pack("=IIIIHH", proc_connector.CN_IDX_PROC, proc_connector.CN_VAL_PROC, 0, 0, len(data), 0) + data
    return struct.pack("=IHHII", 16 + len(cn), proc_connector.NLMSG_DONE, 0, 0, 0) + cn


def test_the_event_filter_is_asked_for_after_the_plain_subscription_and_a_kernel_ignoring_it_is_noticed(monkeypatch):
    connector, sock = _subscribed(monkeypatch, (6, 18))
    assert struct.unpack("=I", _payload(sock.sent[0])) == (proc_connector.PROC_CN_MCAST_LISTEN,)  # acknowledged
    assert struct.unpack("=II", _payload(sock.sent[1])) == (proc_connector.PROC_CN_MCAST_LISTEN,
                                                            proc_connector.WANTED_EVENTS)
    assert connector.filter == "kernel filter: fork, exec, comm, exit only"
    # a kernel that took the 8-byte request for nothing sends a uid change (0x4) all the same
    queued = [_datagram(proc_connector.PROC_EVENT_EXEC, 10), _datagram(0x4, 11)]

    def recv_into(buffer):
        if not queued:
            raise BlockingIOError()
        data = queued.pop(0)
        buffer[:len(data)] = data
        return len(data)

    connector._sock = SimpleNamespace(recv_into=recv_into)
    assert [e.kind for e in connector.drain().events] == ["exec", "other"]
    assert connector.filter.startswith("none: the kernel ignored the event-type filter")


def test_a_kernel_before_6_6_is_not_asked_for_the_filter(monkeypatch):
    connector, sock = _subscribed(monkeypatch, (6, 1))
    assert len(sock.sent) == 1 and len(_payload(sock.sent[0])) == 4
    assert "6.1 has no event-type filter" in connector.filter


def test_the_kernel_release_is_read_as_major_and_minor():
    assert proc_connector.kernel_release("6.18.44-fc-v657") == (6, 18)
    assert proc_connector.kernel_release("5.4.0-150-generic") == (5, 4)
    assert proc_connector.kernel_release("6.6-rc1") == (6, 6)


# -- the inventory with light processes (real processes, events given) -----------------------------

def _event(kind, pid, tid=None, parent=0, comm=None):
    return ProcEvent(kind, tid or pid, pid, time.monotonic_ns(), 0, parent, parent, comm)


@pytest.fixture
def counted(monkeypatch):
    """Every read of a process's threads, counted."""
    reads = {"thread_stats": 0, "affinity": 0}
    real_stats, real_affinity = procfs.read_thread_stats, procfs.read_affinity

    def thread_stats(pid):
        reads["thread_stats"] += 1
        return real_stats(pid)

    def affinity(tid, pid=None):
        reads["affinity"] += 1
        return real_affinity(tid, pid)

    monkeypatch.setattr(procfs, "read_thread_stats", thread_stats)
    monkeypatch.setattr(procfs, "read_affinity", affinity)
    return reads


def test_an_exec_no_profile_can_match_reads_no_thread_and_changes_nothing(spawn, counted):
    inventory = Inventory()  # not started: the batches are given
    inventory.set_gate(index(profile(process_names=("tmpd-cand*",), cmdline=("--tmpd-cand",))))
    other = spawn("tmpd-other")
    other.wait_ready()
    other.command("burst 20 w-")
    changes = []
    inventory._apply_batch(Batch([_event("exec", other.pid)]), changes)
    assert changes == []  # nothing to replan for
    assert counted == {"thread_stats": 0, "affinity": 0}
    snap = inventory.snapshot().process(other.pid)
    assert snap.light and list(snap.threads) == [other.pid]  # its leader only
    inventory._apply_batch(Batch([_event("fork", other.pid, 999999999)]), changes)  # a thread of it: not read
    assert changes == [] and counted["affinity"] == 0
    # renamed into a candidate: tracked from now on, its threads read
    inventory._apply_batch(Batch([_event("comm", other.pid, comm="tmpd-cand")]), changes)
    assert changes[-1].kind == NEW_PROCESS and changes[-1].pid == other.pid
    assert len(inventory.snapshot().process(other.pid).threads) == 21


def test_a_child_of_a_tracked_process_is_tracked_and_one_of_a_light_process_costs_no_read(spawn, counted):
    inventory = Inventory()
    inventory.set_gate(index(profile(process_names=("tmpd-cand",))))
    tracked, light = spawn("tmpd-cand"), spawn("tmpd-other")
    tracked.wait_ready()
    light.wait_ready()
    changes = []
    inventory._apply_batch(Batch([_event("exec", tracked.pid), _event("exec", light.pid)]), changes)
    assert [c.pid for c in changes] == [tracked.pid]
    child_of_tracked = int(tracked.command("fork x"))
    child_of_light = int(light.command("fork x"))
    before = dict(counted)
    inventory._apply_batch(Batch([_event("fork", child_of_light, parent=light.pid)]), changes)
    assert counted == before and inventory._store.light[child_of_light].start_time is None
    inventory._apply_batch(Batch([_event("fork", child_of_tracked, parent=tracked.pid)]), changes)
    assert changes[-1].kind == NEW_PROCESS and changes[-1].pid == child_of_tracked  # inheritance needs it


def test_a_scan_reads_threads_of_tracked_processes_only(spawn, counted, monkeypatch):
    listed = []
    counting = procfs.read_thread_stats
    monkeypatch.setattr(procfs, "read_thread_stats", lambda pid: listed.append(pid) or counting(pid))
    inventory = Inventory()
    inventory.set_gate(index(profile(process_names=("tmpd-cand",))))
    tracked, light = spawn("tmpd-cand"), spawn("tmpd-other")
    tracked.wait_ready()
    light.wait_ready()
    light.command("burst 50 w-")
    inventory.reconcile()
    assert tracked.pid in inventory._store.procs and light.pid in inventory._store.light
    # At most one listing per tracked process (none where its leader's stat says it is alone), none of the light one.
    assert len(listed) == len(set(listed)) == counted["thread_stats"] and set(listed) <= inventory._store.procs.keys()
    assert all(t.pid != light.pid for t in inventory.snapshot().threads.values() if t.tid != light.pid)
    again = inventory.reconcile()
    assert all(change.pid != light.pid for change in again.changes)


def test_this_kernel_takes_the_filter_and_still_sends_execs():
    connector = ProcConnector()
    try:
        connector.open()
    except proc_connector.ConnectorUnavailable as exc:
        pytest.skip(str(exc))
    try:
        if proc_connector.kernel_release() < proc_connector.FILTER_SINCE:
            pytest.skip("the kernel predates the event-type filter")
        child = subprocess.Popen(["setsid", "/bin/true"])  # a sid change (kept out) and an exec (let in)
        child.wait()
        seen = []
        deadline = time.monotonic() + 5
        while not any(e.kind == "exec" and e.pid == child.pid for e in seen) and time.monotonic() < deadline:
            select.select([connector.fileno()], [], [], 0.1)
            seen.extend(connector.drain().events)
        assert any(e.kind == "exec" and e.pid == child.pid for e in seen)
        assert not [e for e in seen if e.kind == "other"]
        assert connector.filter == "kernel filter: fork, exec, comm, exit only"
    finally:
        connector.close()


def test_an_untracked_process_that_execs_and_ends_within_a_batch_is_not_read():
    from temperd.sources.events import passing_execs
    ev = lambda kind, pid, tid=None, parent=0: ProcEvent(kind, tid or pid, pid, 0, 0, parent, parent)  # noqa: E731
    loop = [ev("fork", 10, parent=1), ev("exec", 10), ev("exit", 10)]
    assert passing_execs(loop, procs={}, bound=()) == {10}
    assert passing_execs(loop[:2], procs={}, bound=()) == set()  # not ended: read
    assert passing_execs(loop, procs={10: None}, bound=()) == set()  # tracked: read as before
    assert passing_execs(loop, procs={}, bound={10}) == set()  # a runtime binding names it
    # it forked, made a thread, was renamed or exec'd twice: read as before (inheritance, titles)
    assert passing_execs(loop[:2] + [ev("fork", 11, parent=10), ev("exit", 10)], {}, ()) == set()
    assert passing_execs(loop[:2] + [ev("fork", 10, 12), ev("exit", 10)], {}, ()) == set()
    assert passing_execs(loop[:2] + [ev("comm", 10), ev("exit", 10)], {}, ()) == set()
    assert passing_execs(loop[:2] + [ev("exec", 10), ev("exit", 10)], {}, ()) == set()
    assert passing_execs([ev("exit", 10), ev("exec", 10), ev("exit", 10)], {}, ()) == set()  # a reused pid


def test_an_exec_and_end_in_one_batch_cost_no_read_and_count_as_gone(monkeypatch):
    inventory = Inventory()
    inventory.set_gate(index(profile(process_names=("tmpd-cand*",), cmdline=("--tmpd-cand",))))
    reads = []
    monkeypatch.setattr(procfs, "read_task_stat", lambda pid, tid: reads.append(pid))
    changes = []
    inventory._apply_batch(Batch([_event("fork", 424242, parent=1), _event("exec", 424242),
                                  _event("exit", 424242)]), changes)
    assert changes == [] and reads == [] and 424242 not in inventory._store.light
    assert inventory.stats.vanished == 1 and inventory.stats.events_received == 3


def test_a_new_candidate_is_read_once_the_gate_read_its_owner_and_cgroup(spawn, monkeypatch):
    """The gate reads a candidate's cgroup and owner (trust, the untrusted bounds); the record
    made of it takes them, not a second read of each (the status file is the costliest read)."""
    inventory = Inventory()
    inventory.set_gate(index(profile(process_names=("tmpd-cand",))))
    job = spawn("tmpd-cand")
    job.wait_ready()
    reads = {"uid": 0, "cgroup": 0}
    real_uid, real_cgroup = procfs.read_uid, procfs.read_cgroup

    def uid(*args, **kwargs):
        reads["uid"] += 1
        return real_uid(*args, **kwargs)

    def cgroup(*args, **kwargs):
        reads["cgroup"] += 1
        return real_cgroup(*args, **kwargs)

    monkeypatch.setattr(procfs, "read_uid", uid)
    monkeypatch.setattr(procfs, "read_cgroup", cgroup)
    changes = []
    inventory._apply_batch(Batch([_event("exec", job.pid)]), changes)
    assert changes[-1].kind == NEW_PROCESS and changes[-1].pid == job.pid
    facts = inventory.snapshot().process(job.pid)
    assert facts.uid == os.getuid() and facts.cgroup == procfs.read_cgroup(job.pid).unified
    assert reads == {"uid": 1, "cgroup": 2}  # the second: the assertion's own
