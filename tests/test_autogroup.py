"""Autogroup nice: which sessions get one, held through the state file, on real sessions."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from temperd.backends.native import autogroup
from temperd.backends.native.autogroup import (AUTOGROUP, YIELD_NICE, Autogroups, Session, autogroup_enabled,
                                               read_autogroup, wanted_nices)
from temperd.plan import LATENCY, OPEN, YIELD, Layer, MemberSelector
from temperd.sources import procfs

needs_autogroup = pytest.mark.skipif(os.geteuid() != 0 or not autogroup_enabled(),
                                     reason="needs root and kernel.sched_autogroup_enabled=1")


def test_whole_sessions_get_a_nice_and_mixed_ones_keep_theirs():
    found = {
        "/autogroup-1": Session(10, {YIELD}),
        "/autogroup-2": Session(20, {"favoured"}, [-5, -2]),
        "/autogroup-3": Session(30, {"favoured"}, [3]),  # no negative nice: left
        "/autogroup-4": Session(40, {"favoured"}),  # no nice at all: left
        "/autogroup-5": Session(50, {YIELD, "none"}),  # mixed: its yield threads are the idle cgroup's
        "/autogroup-6": Session(60, {"favoured", "none"}, [-5]),  # untreated threads share it: left, quietly
        "/autogroup-7": Session(70, {YIELD, "favoured"}, [-5]),  # mixed
    }
    assert wanted_nices(found) == {"/autogroup-1": YIELD_NICE, "/autogroup-2": -5}
    assert sorted(name for name, session in found.items() if session.mixed) == ["/autogroup-5", "/autogroup-7"]


def test_a_mixed_sessions_yield_threads_are_collected_for_the_idle_cgroup():
    threads = [_Thread(11, 10), _Thread(12, 10), _Thread(21, 20)]
    bg = _layer("bg", YIELD, [12, 21], policy="idle")
    found = autogroup.sessions(threads, lambda t: bg if t.tid in (12, 21) else None, lambda t: False,
                               group_of=lambda pid: (f"/autogroup-{pid}", 0))
    assert found["/autogroup-10"].mixed and [t.tid for t in found["/autogroup-10"].yielding] == [12]
    assert not found["/autogroup-20"].mixed  # all yield: autogroup nice 19 instead


def test_state_from_the_earlier_layout_is_adopted():
    held = Autogroups()
    held.adopt_state({"/autogroup-7": {"pid": 70, "start_time": 1234, "original": 0, "written": 19}})
    assert (held.originals, held.written) == ({"/autogroup-7": 0}, {"/autogroup-7": 19})
    assert held.groups.members == {"/autogroup-7": (70, 1234)}


def _layer(name, treatment, tids, **kw):
    return Layer(name=name, kind=OPEN, treatment=treatment, tier="standard", workload="w", group=name,
                 selector=MemberSelector(tids=tuple(tids)), **kw)


@needs_autogroup
def test_a_session_is_weighed_restored_and_recovered_from_the_state_file(children):
    job = children.spawn(["ag-a", "ag-b"])  # a session of its own
    name, before = read_autogroup(job.pid)
    threads = [_Thread(tid, job.pid) for tid in job.tids()]
    layer = _layer("bg", YIELD, job.tids(), policy="idle")

    crashed = Autogroups()
    result = crashed.apply(threads, lambda t: layer, lambda t: False)
    assert result.applied == {AUTOGROUP: 1} and read_autogroup(job.pid) == (name, YIELD_NICE)
    section = json.loads(json.dumps(crashed.state()))  # what the state file keeps
    assert section["written"] == {name: YIELD_NICE} and section["members"][name][0] == job.pid

    fresh = Autogroups()  # the next start, after a kill
    fresh.adopt_state(section)
    assert fresh.restore_all().restored == {AUTOGROUP: 1}
    assert read_autogroup(job.pid) == (name, before)

    latency = _layer("lat", LATENCY, job.tids(), nice=-4)
    held = Autogroups()
    assert held.apply(threads, lambda t: latency, lambda t: False).applied == {AUTOGROUP: 1}
    assert read_autogroup(job.pid) == (name, -4)
    with open(f"/proc/{job.pid}/autogroup", "w") as handle:
        handle.write("3")  # someone else
    assert held.apply(threads, lambda t: latency, lambda t: False).drift == {AUTOGROUP: 1}
    assert not held.restore_all().restored
    assert read_autogroup(job.pid) == (name, 3)  # theirs


class _Thread:
    def __init__(self, tid, pid):
        self.tid, self.pid, self.start_time, self.comm = tid, pid, 0, ""


_SETSID_ON_LINE = ("import os, sys\n"
                   "print(os.getpid(), flush=True)\n"
                   "sys.stdin.readline(); os.setsid(); print('moved', flush=True)\n"
                   "sys.stdin.readline()\n")
# A session leader of its own that starts the movers, so that they share a session that is not
# the test's: pytest may run in the root autogroup (init's session), which the kernel does not name.
_LEADER = ("import subprocess, sys\n"
           "script, fds = sys.argv[1], [int(fd) for fd in sys.argv[2:]]\n"
           "movers = [subprocess.Popen([sys.executable, '-c', script], stdin=fds[i], stdout=fds[i + 1])\n"
           "          for i in range(0, len(fds), 2)]\n"
           "for mover in movers:\n"
           "    mover.wait()\n")


class _Mover:
    def __init__(self, to_fd: int, from_fd: int):
        self.to, self.reply = os.fdopen(to_fd, "w"), os.fdopen(from_fd)
        self.pid = int(self.reply.readline())


@pytest.fixture
def movers():
    """start(n): n processes sharing one new session, each calling setsid() when move() tells it to."""
    leaders, started = [], []

    def start(count):
        ends, child_fds = [], []
        for _ in range(count):
            to_r, to_w = os.pipe()
            from_r, from_w = os.pipe()
            ends.append((to_w, from_r))
            child_fds += [to_r, from_w]
        leader = subprocess.Popen([sys.executable, "-c", _LEADER, _SETSID_ON_LINE, *map(str, child_fds)],
                                  pass_fds=child_fds, start_new_session=True)
        leaders.append(leader)
        for fd in child_fds:
            os.close(fd)
        group = [_Mover(*pair) for pair in ends]
        started.extend(group)
        return group

    def move(mover):
        mover.to.write("\n")
        mover.to.flush()
        assert mover.reply.readline().strip() == "moved"

    yield start, move
    for mover in started:
        try:
            os.kill(mover.pid, 9)
        except ProcessLookupError:
            pass
        mover.to.close()
        mover.reply.close()
    for leader in leaders:
        leader.kill()
        leader.wait(10)


def _counting_reads(monkeypatch):
    reads = []

    def counted(pid):
        reads.append(pid)
        return read_autogroup(pid)

    monkeypatch.setattr(autogroup, "read_autogroup", counted)
    return reads


@needs_autogroup
def test_session_cache_reads_an_untreated_process_once_and_a_treated_one_every_pass(children, monkeypatch):
    quiet, other, served = (children.spawn([name]) for name in ("ag-quiet", "ag-other", "ag-served"))
    threads = [_Thread(pid, pid) for pid in (quiet.pid, other.pid, served.pid)]
    layer = _layer("lat", LATENCY, [served.pid], nice=-4)
    layer_for = lambda t: layer if t.pid == served.pid else None  # noqa: E731
    reads = _counting_reads(monkeypatch)
    cache = autogroup.SessionCache()

    first = cache.sessions(threads, layer_for, lambda t: False)
    assert sorted(reads) == sorted([quiet.pid, other.pid, served.pid])
    assert first[read_autogroup(served.pid)[0]].classes == {"favoured"}
    reads.clear()
    cache.sessions(threads, layer_for, lambda t: False)
    assert reads == [served.pid]
    newcomer = children.spawn(["ag-new"])
    reads.clear()
    cache.sessions(threads + [_Thread(newcomer.pid, newcomer.pid)], layer_for, lambda t: False)
    assert sorted(reads) == sorted([served.pid, newcomer.pid])


@needs_autogroup
def test_session_cache_sees_a_process_that_left_a_treated_session_by_setsid(movers):
    start, move = movers
    served, child = start(2)  # both in one session, as a fork before its setsid is
    threads = [_Thread(served.pid, served.pid), _Thread(child.pid, child.pid)]
    layer = _layer("bg", YIELD, [served.pid], policy="idle")
    layer_for = lambda t: layer if t.pid == served.pid else None  # noqa: E731
    cache = autogroup.SessionCache()

    shared = read_autogroup(served.pid)[0]
    assert cache.sessions(threads, layer_for, lambda t: False)[shared].classes == {YIELD, "none"}
    move(child)  # untreated, cached in a treated session: read again on the next pass
    found = cache.sessions(threads, layer_for, lambda t: False)
    assert found[shared].classes == {YIELD}
    assert read_autogroup(child.pid)[0] in found and read_autogroup(child.pid)[0] != shared
    move(served)  # the treated process itself moves: read on every pass
    found = cache.sessions(threads, layer_for, lambda t: False)
    assert found[read_autogroup(served.pid)[0]].classes == {YIELD} and shared not in found


@needs_autogroup
def test_between_whole_applies_a_setsid_is_seen_when_its_process_is_touched_or_at_the_recheck(movers):
    start, move = movers
    served, child = start(2)
    threads = [_Thread(served.pid, served.pid), _Thread(child.pid, child.pid)]
    layer = _layer("bg", YIELD, [served.pid], policy="idle")
    layer_for = lambda t: layer if t.pid == served.pid else None  # noqa: E731
    now = [100.0]
    cache = autogroup.SessionCache(clock=lambda: now[0])
    shared = read_autogroup(served.pid)[0]

    def after(seconds, touched=()):
        now[0] += seconds
        return cache.sessions(threads, layer_for, lambda t: False, touched=set(touched))

    assert after(0)[shared].classes == {YIELD, "none"}
    move(child)
    assert after(1)[shared].classes == {YIELD, "none"}  # neither touched nor due: the cache stands
    assert after(autogroup.SessionCache.RECHECK_S - 1)[shared].classes == {YIELD}  # the recheck reads it
    move(served)
    found = after(1, touched=[served.pid])  # the batch's own process: read at once
    assert shared not in found and found[read_autogroup(served.pid)[0]].classes == {YIELD}


@needs_autogroup
def test_only_a_treated_newcomer_or_one_in_a_treated_session_changes_the_mix(movers, children):
    start, _move = movers
    served, forked = start(2)  # forked: in served's session, as a fork of it is
    stranger = children.spawn(["ag-stranger"])  # a session of its own
    layer = _layer("bg", YIELD, [served.pid], policy="idle")
    layer_for = lambda t: layer if t.pid == served.pid else None  # noqa: E731
    cache = autogroup.SessionCache()
    cache.sessions([_Thread(served.pid, served.pid)], layer_for, lambda t: False)

    assert not cache.changes_mix([_Thread(stranger.pid, stranger.pid)], layer_for, lambda t: False)
    assert cache.changes_mix([_Thread(forked.pid, forked.pid)], layer_for, lambda t: False)
    assert cache.changes_mix([_Thread(served.pid + 0, served.pid)], layer_for, lambda t: False)  # treated itself


def test_a_batch_is_counted_into_its_sessions_only_where_every_sessions_classes_stay(monkeypatch):
    """SessionCache.count, between whole passes: the batch's threads counted as the last pass
    counted every thread; None (the whole pass) where a session gains or loses a class, a thread
    is favoured, a session is new or a recheck is due."""
    now = [0.0]
    cache = autogroup.SessionCache(clock=lambda: now[0])
    monkeypatch.setattr(autogroup, "read_autogroup", lambda pid: (f"/autogroup-{pid // 10}", 0))
    bg = _layer("bg", YIELD, [], policy="idle")
    fav = _layer("fav", LATENCY, [], nice=-5)
    layers = {}
    layer_for = lambda t: layers.get(t.tid)  # noqa: E731
    host = [_Thread(10, 10), _Thread(11, 10), _Thread(20, 20)]  # session 1 mixed, session 2 untreated
    layers[11] = bg
    cache.sessions(host, layer_for, lambda t: False, touched=None)

    layers[12] = bg
    assert [(t.tid, kind, mixed) for t, kind, mixed in cache.count([_Thread(12, 10)], layer_for, lambda t: False)] \
        == [(12, YIELD, True)]
    reads = []
    monkeypatch.setattr(autogroup, "read_autogroup", lambda pid: reads.append(pid) or (f"/autogroup-{pid // 10}", 0))
    groups = {}  # an untreated newcomer: changes_mix reads its autogroup, and count takes that read
    assert cache.changes_mix([_Thread(16, 10)], layer_for, lambda t: False, groups)
    assert [kind for _t, kind, _mixed in cache.count([_Thread(16, 10)], layer_for, lambda t: False, groups)] == ["none"]
    assert reads == [10]
    layers.pop(11)  # 11 leaves the yield layer: 12 still yields, the mix stays
    assert [(t.tid, kind, mixed) for t, kind, mixed in cache.count([_Thread(11, 10)], layer_for, lambda t: False)] \
        == [(11, "none", True)]
    layers[21] = bg  # session 2 gains a yield thread: its mix changes
    assert cache.count([_Thread(21, 20)], layer_for, lambda t: False) is None
    layers[13] = fav
    assert cache.count([_Thread(13, 10)], layer_for, lambda t: False) is None
    assert cache.count([_Thread(31, 30)], layer_for, lambda t: False) is None  # a session not seen
    cache.forget([(12, 0)])  # the last yield thread of session 1 ended: a new one changes the mix again
    layers[14] = bg
    assert cache.count([_Thread(14, 10)], layer_for, lambda t: False) is None
    now[0] += autogroup.SessionCache.RECHECK_S
    assert cache.count([_Thread(15, 10)], layer_for, lambda t: False) is None



@needs_autogroup
def test_a_sessions_nice_goes_back_through_another_member_once_the_one_that_reached_it_ended():
    # A session of its own: the leader forks a member (same session), then becomes a sleep.
    leader = subprocess.Popen(["sh", "-c", "sleep 60 & exec sleep 60"], start_new_session=True)
    member = None
    try:
        deadline = time.monotonic() + 10
        while not procfs.read_children(leader.pid):
            assert time.monotonic() < deadline, "the leader forked no member"
            time.sleep(0.01)
        member = procfs.read_children(leader.pid)[0]
        name, before = read_autogroup(leader.pid)
        assert read_autogroup(member)[0] == name
        held = Autogroups()
        held.groups.locate(name, leader.pid)
        assert held.hold({name: -10}).applied == {AUTOGROUP: 1}
        assert read_autogroup(member)[1] == -10
        leader.kill()
        leader.wait(10)
        restored = held.restore_all()
        assert not restored.failed, restored.errors
        assert read_autogroup(member) == (name, before)
    finally:
        if leader.poll() is None:
            leader.kill()
            leader.wait(10)
        if member is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(member, signal.SIGKILL)
