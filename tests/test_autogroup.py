"""Autogroup nice: which sessions get one, held through the state file, on real sessions."""

from __future__ import annotations

import json
import os

import pytest

from temperd.backends.native.autogroup import (YIELD_NICE, Autogroups, Session, autogroup_enabled, read_autogroup,
                                               wanted_nices)
from temperd.plan import LATENCY, OPEN, YIELD, Layer, MemberSelector

needs_autogroup = pytest.mark.skipif(os.geteuid() != 0 or not autogroup_enabled(),
                                     reason="needs root and kernel.sched_autogroup_enabled=1")


def test_whole_sessions_get_a_nice_and_mixed_ones_a_note():
    wanted, notes = wanted_nices({
        "/autogroup-1": Session(10, {YIELD}),
        "/autogroup-2": Session(20, {"favoured"}, [-5, -2]),
        "/autogroup-3": Session(30, {"favoured"}, [3]),  # no negative nice: left
        "/autogroup-4": Session(40, {"favoured"}),  # no nice at all: left
        "/autogroup-5": Session(50, {YIELD, "none"}),
        "/autogroup-6": Session(60, {"favoured", "none"}, [-5]),  # untreated threads share it: left, quietly
    })
    assert wanted == {"/autogroup-1": YIELD_NICE, "/autogroup-2": -5}
    assert notes == ["autogroup /autogroup-5 (session of pid 50) mixes yield threads with others: "
                     "their SCHED_IDLE/BATCH only yields inside that session"]


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
    assert result.applied == 1 and read_autogroup(job.pid) == (name, YIELD_NICE)
    section = json.loads(json.dumps(crashed.state()))  # what the state file keeps
    assert section["written"] == {name: YIELD_NICE} and section["members"][name][0] == job.pid

    fresh = Autogroups()  # the next start, after a kill
    fresh.adopt_state(section)
    assert fresh.restore_all().restored == 1
    assert read_autogroup(job.pid) == (name, before)

    latency = _layer("lat", LATENCY, job.tids(), nice=-4)
    held = Autogroups()
    assert held.apply(threads, lambda t: latency, lambda t: False).applied == 1
    assert read_autogroup(job.pid) == (name, -4)
    with open(f"/proc/{job.pid}/autogroup", "w") as handle:
        handle.write("3")  # someone else
    assert held.apply(threads, lambda t: latency, lambda t: False).drift == 1
    assert held.restore_all().restored == 0
    assert read_autogroup(job.pid) == (name, 3)  # theirs


class _Thread:
    def __init__(self, tid, pid):
        self.tid, self.pid, self.start_time, self.comm = tid, pid, 0, ""
