"""The observer on a real process: the threads of a process that did not run since the previous
sample are not read again (a sleeping pool of thousands of members would cost three reads each,
every sample), yet every member is still reported; they are read again once the process's CPU
time moves, or the plan changes."""

from __future__ import annotations

import dataclasses
import time

import pytest

from temperd.decide.matcher import MatchResult
from temperd.observe import observer as observer_module
from temperd.observe.observer import Observer
from temperd.plan import OPEN, YIELD, Layer, LayerPlan, MemberSelector
from temperd.sources.inventory import Inventory
from temperd.sources.shape import read_shape

POOL = 4


@pytest.fixture
def pool(spawn):
    """A process with POOL threads that sleep until told otherwise, and a layer of them."""
    child = spawn("tmpd-pool")
    child.wait_ready()
    tids = tuple(int(t) for t in child.command(f"burst {POOL} pool-").split())
    time.sleep(0.2)  # the new threads settle into their wait
    layer = Layer(name="w.pool", kind=OPEN, treatment=YIELD, tier="standard", workload="w", group="pool",
                  selector=MemberSelector(pids=(child.pid,), tids=tids), policy="batch")
    return child, tids, LayerPlan(layers=(layer,), reserve_cpus=(0,))


@pytest.fixture
def reads(monkeypatch):
    """The (pid, tid) of every thread the observer reads from /proc."""
    seen = []
    read = observer_module._read_thread

    def counting(pid, tid):
        seen.append((pid, tid))
        return read(pid, tid)

    monkeypatch.setattr(observer_module, "_read_thread", counting)
    return seen


def _members(observation, tids):
    return {t.tid: t for t in observation.threads if t.tid in tids}


def test_a_process_that_did_not_run_is_reported_without_reading_its_threads_and_read_again_once_it_runs(pool, reads):
    child, tids, plan = pool
    inventory = Inventory()
    inventory.reconcile()
    observer = Observer(read_shape())
    observer.sample(plan, inventory.processes, MatchResult())
    time.sleep(0.1)
    quiet = observer.sample(plan, inventory.processes, MatchResult())  # read: nothing of it ran since the first
    assert {tid for pid, tid in reads if pid == child.pid} >= set(tids)
    reads.clear()

    time.sleep(0.1)
    kept = observer.sample(plan, inventory.processes, MatchResult())
    assert [r for r in reads if r[0] == child.pid] == []
    # Every member is still there, as last read, and the layer's totals are what reading gives.
    assert _members(kept, tids) == _members(quiet, tids) and len(_members(kept, tids)) == POOL
    (layer,) = kept.layers
    assert (layer.members, layer.util, layer.wait) == (POOL, 0.0, 0.0)

    child.command("spin spinner")  # a new thread burns 50 ms of CPU: the process's ticks move
    moved = observer.sample(plan, inventory.processes, MatchResult())
    assert {tid for pid, tid in reads if pid == child.pid} >= set(tids)
    assert [dataclasses.replace(t, util=0.0, wait=0.0) for t in _members(moved, tids).values()] == \
        list(_members(quiet, tids).values())


def test_a_new_plan_reads_every_member_again(pool, reads):
    child, tids, plan = pool
    inventory = Inventory()
    inventory.reconcile()
    observer = Observer(read_shape())
    for _ in range(3):
        observer.sample(plan, inventory.processes, MatchResult())
        time.sleep(0.05)
    reads.clear()
    observer.sample(plan, inventory.processes, MatchResult())
    assert [r for r in reads if r[0] == child.pid] == []
    (layer,) = plan.layers
    changed = LayerPlan(layers=(dataclasses.replace(layer, policy="idle"),), reserve_cpus=(0,))
    observer.sample(changed, inventory.processes, MatchResult())  # the backend may have changed their settings
    assert {tid for pid, tid in reads if pid == child.pid} >= set(tids)


def test_each_cpu_idle_share_is_read_from_proc_stat_over_the_window():
    """The linter judges a spill by whether the layer's CPUs had room; a CPU kept busy by a thread
    the observer does not read (here a spinner outside every plan) shows as busy all the same."""
    import os
    import subprocess

    cpu = min(os.sched_getaffinity(0))
    observer = Observer(read_shape())
    plan = LayerPlan(layers=(), reserve_cpus=(cpu,))
    assert observer.sample(plan, {}, MatchResult()).cpu_idle == {}  # no window yet
    spinner = subprocess.Popen(["sh", "-c", "while :; do :; done"], preexec_fn=lambda: os.sched_setaffinity(0, {cpu}))
    try:
        observer.sample(plan, {}, MatchResult())
        ticks = 0
        deadline = time.monotonic() + 30
        while ticks < 30 and time.monotonic() < deadline:  # until the spinner has had 0.3 s of CPU
            fields = open(f"/proc/{spinner.pid}/stat").read().rsplit(")", 1)[1].split()
            ticks = int(fields[11]) + int(fields[12])
            time.sleep(0.05)
        seen = observer.sample(plan, {}, MatchResult())
    finally:
        spinner.kill()
        spinner.wait()
    assert set(seen.cpu_idle) >= set(os.sched_getaffinity(0))
    assert seen.cpu_idle[cpu] < 0.5, seen.cpu_idle
    assert all(0.0 <= share <= 1.0 for share in seen.cpu_idle.values())
