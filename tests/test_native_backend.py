"""The native backend on real threads of this host: applied, read back from /proc, restored.

The thread list given to apply() is the test's own children (plus the per-CPU kernel threads
of the exclusive CPU), standing in for the host's: the backend keeps every thread it is given
off the exclusive CPU, and the rest of the host is left alone while other tests run.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from temperd.backends.native import sched
from temperd.backends.native.autogroup import AUTOGROUP, autogroup_enabled, read_autogroup
from temperd.backends.native.backend import NativeBackend, scan_threads
from temperd.backends.native.cgroup_weight import CgroupWeights, WeightSupport
from temperd.plan import CONFINED, EXCLUSIVE, FENCED, LATENCY, OPEN, OWNED, YIELD, Layer, LayerPlan, MemberSelector
from temperd.backends.native.pmqos import PmQos
from temperd.backends.status import BackendStatus
from temperd.sources import procfs
from temperd.sources.shape import format_cpulist, online_cpus
from thread_children import (needs_two_cpus, ticks_used_until, cpus_allowed, nice_of, percpu_kthreads, policy_of, read_json_line,
                             snapshot)

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="changing other processes' scheduling needs root"),
    needs_two_cpus,
]

EXCL_CPU = 1


def _rest() -> str:
    return format_cpulist(frozenset(online_cpus()) - {EXCL_CPU})


def layer(name, kind, treatment, tids=(), pids=(), cpus=(), comm=(), catch_all=False, **kw) -> Layer:
    kw.setdefault("ownership", FENCED)  # these tests' exclusive layers are fenced unless one says owned
    return Layer(name=name, kind=kind, treatment=treatment, tier=kw.pop("tier", "critical"), workload="w", group=name,
                 selector=MemberSelector(pids=tuple(pids), tids=tuple(tids), comm_patterns=tuple(comm),
                                         catch_all=catch_all), cpus=tuple(cpus), **kw)


def make_backend(state_dir, **kw) -> NativeBackend:
    # Tier weights are exercised in test_cgroup_weight.py; here they stay off, and PM QoS points at
    # a scratch tree unless a test asks for the real one.
    kw.setdefault("weights", CgroupWeights(WeightSupport(None, None, "off in this test")))
    kw.setdefault("pmqos", PmQos(str(state_dir) + "/no-sysfs"))
    return NativeBackend(str(state_dir), **kw)


@pytest.fixture
def backends():
    """Backends made by a test; stopped at the end even when the test fails (restores the host)."""
    made = []

    def make(state_dir, **kw):
        backend = make_backend(state_dir, **kw)
        made.append(backend)
        return backend

    yield make
    for backend in made:
        backend.stop()


@pytest.fixture
def server(children):
    """A 'server' with an exclusive hot thread, a latency thread and an untreated one; a yield job;
    a bystander process; each in its own session (autogroup)."""
    srv = children.spawn(["hot-0", "net-io", "misc"])
    job = children.spawn(["bg-a", "bg-b"])
    batch = children.spawn(["bt-a"])
    other = children.spawn(["other-a", "other-b"])
    return srv, job, batch, other


def full_plan(srv, job, batch) -> LayerPlan:
    slice_us = 300
    return LayerPlan(layers=(
        layer("srv.hot", CONFINED, EXCLUSIVE, tids=[srv.threads["hot-0"]], pids=[srv.pid], cpus=[EXCL_CPU],
              comm=["hot-*"], protected=True),
        layer("srv.net", OPEN, LATENCY, tids=[srv.threads["net-io"]], pids=[srv.pid], comm=["net-*"], nice=-5,
              slice_us=slice_us),
        layer("job.bg", OPEN, YIELD, tids=job.tids(), pids=[job.pid], catch_all=True, policy="idle",
              tier="background"),
        layer("batch.bt", OPEN, YIELD, tids=batch.tids(), pids=[batch.pid], catch_all=True, policy="batch", nice=19,
              tier="background"),
    ), reserve_cpus=(0,))


def universe(*kids, kthreads=True):
    threads = scan_threads([k.pid for k in kids])
    if kthreads:
        threads += scan_threads(percpu_kthreads(EXCL_CPU))
    return threads


def test_apply_reads_back_from_proc_and_stop_restores(tmp_path, children, backends, server):
    srv, job, batch, other = server
    before = {k.pid: snapshot(k.pid) for k in server}
    kthreads = percpu_kthreads(EXCL_CPU)
    kbefore = {t: cpus_allowed(t, t) for t in kthreads}
    backend = backends(tmp_path)

    result = backend.apply(full_plan(srv, job, batch), universe(*server))
    assert not result.failed and not result.errors, result.errors
    rest = _rest()

    # Exclusive member pinned; every other given thread kept off the exclusive CPU.
    assert cpus_allowed(srv.pid, srv.threads["hot-0"]) == str(EXCL_CPU)
    for kid in server:
        for tid in kid.tids():
            if tid != srv.threads["hot-0"]:
                assert cpus_allowed(kid.pid, tid) == rest, (kid.pid, tid)
    # Latency: nice and a custom slice.
    net = srv.threads["net-io"]
    assert (policy_of(srv.pid, net), nice_of(srv.pid, net)) == (sched.SCHED_OTHER, -5)
    if sched.slice_support().supported:
        assert sched.get_sched(net).slice_ns == 300_000
    else:
        assert any("custom slice" in u for u in result.unsupported)
    # Yield: SCHED_IDLE, and SCHED_BATCH + nice 19.
    for tid in job.tids():
        assert policy_of(job.pid, tid) == sched.SCHED_IDLE
    assert (policy_of(batch.pid, batch.threads["bt-a"]), nice_of(batch.pid, batch.threads["bt-a"])) == (3, 19)
    # Untreated threads keep policy and nice.
    assert snapshot(other.pid) == {t: (rest, p, n) for t, (_, p, n) in before[other.pid].items()}
    # Per-CPU kernel threads of the exclusive CPU cannot leave: left, counted, named.
    assert result.unmovable >= len(kthreads)
    assert {t: cpus_allowed(t, t) for t in kthreads} == kbefore
    if kthreads:
        assert any("per-CPU kernel thread" in n for n in result.notes)
    assert result.applied["affinity"] == sum(len(k.tids()) for k in server)  # every given user thread
    assert os.path.exists(backend.ledger.path)

    stopped = backend.stop()
    assert not stopped.failed, stopped.errors
    assert {k.pid: snapshot(k.pid) for k in server} == before
    assert not os.path.exists(backend.ledger.path)


def test_new_threads_are_treated_at_once(tmp_path, children, backends, server):
    srv, job, batch, other = server
    backend = backends(tmp_path)
    backend.apply(full_plan(srv, job, batch), universe(*server, kthreads=False))
    hot = srv.spawn("hot-1")  # matches the exclusive layer's thread-name rule
    net = srv.spawn("net-2")  # the latency layer's
    bg = job.spawn("bg-late")  # catch-all of the yield layer
    stray = other.spawn("other-late")  # nobody's: only kept off the exclusive CPU
    new = [t for t in universe(srv, job, other, kthreads=False) if t.tid in (hot, net, bg, stray)]
    assert len(new) == 4

    result = backend.on_new_threads(new)
    assert not result.failed, result.errors
    assert cpus_allowed(srv.pid, hot) == str(EXCL_CPU)
    assert nice_of(srv.pid, net) == -5
    assert policy_of(job.pid, bg) == sched.SCHED_IDLE
    assert (cpus_allowed(other.pid, stray), policy_of(other.pid, stray), nice_of(other.pid, stray)) == (_rest(), 0, 0)

    backend.stop()
    # Each was created by a thread temperd had kept off CPU 1 (or made SCHED_IDLE) and inherited that;
    # stop() gives back the creator's original, not the inheritance.
    full = format_cpulist(frozenset(online_cpus()))
    for pid, tid in ((srv.pid, hot), (srv.pid, net), (job.pid, bg), (other.pid, stray)):
        assert (cpus_allowed(pid, tid), policy_of(pid, tid), nice_of(pid, tid)) == (full, 0, 0), tid


def test_a_plan_that_changes_only_its_members_reads_only_the_threads_that_moved(tmp_path, children, backends,
                                                                                 server, monkeypatch):
    """After process events the daemon says which threads are new: a plan that differs from the
    one in force only in its members treats those and the threads whose layer changed, and reads
    no other thread's settings (a fork storm costs per fork, not per thread of the host)."""
    srv, job, batch, other = server
    backend = backends(tmp_path)
    plan = full_plan(srv, job, batch)
    backend.apply(plan, universe(*server, kthreads=False))
    late = batch.spawn("bt-late")
    net = srv.threads["net-io"]
    grown = LayerPlan(layers=(plan.layer("srv.hot"), dataclasses.replace(plan.layer("srv.net"), selector=dataclasses.replace(
        plan.layer("srv.net").selector, tids=(), comm_patterns=())), plan.layer("job.bg"),
        dataclasses.replace(plan.layer("batch.bt"), selector=dataclasses.replace(
            plan.layer("batch.bt").selector, tids=tuple(batch.tids())))), reserve_cpus=(0,))
    read = []
    real_get_sched = sched.get_sched
    monkeypatch.setattr(sched, "get_sched", lambda tid: read.append(tid) or real_get_sched(tid))
    threads = {t.tid: t for t in universe(*server, kthreads=False)}
    result = backend.apply(grown, threads, changed=[threads[late]])
    assert not result.failed, result.errors
    assert set(read) == {late, net}  # the new member, and net-io that left its layer: no other thread
    assert (policy_of(batch.pid, late), nice_of(batch.pid, late)) == (sched.SCHED_BATCH, 19)
    assert nice_of(srv.pid, net) == 0  # back to its original
    # A plan whose Confined CPUs change is carried out for every thread, told or not.
    read.clear()
    backend.apply(LayerPlan(layers=grown.layers[1:], reserve_cpus=(0,)), threads, changed=[])
    assert set(read) >= set(threads) - {late, net} - set(job.tids()) - set(batch.tids())


def test_ended_threads_leave_the_ledger_and_a_reused_id_keeps_its_new_thread(tmp_path, children, backends, server):
    """Between whole applies the ledger would otherwise grow with every thread a fork storm made."""
    srv, job, batch, other = server
    backend = backends(tmp_path)
    backend.apply(full_plan(srv, job, batch), universe(*server, kthreads=False))
    job_tids = job.tids()
    assert len(backend.ledger.by_pid(job.pid)) == len(job_tids)
    job.proc.kill()
    job.proc.wait(10)
    backend.forget_threads(job_tids)
    assert backend.ledger.by_pid(job.pid) == []
    # A tid that ended and names a new thread in the same batch: the new one stays held.
    net = srv.threads["net-io"]
    old = backend.ledger.get(net, next(t.start_time for t in universe(srv, kthreads=False) if t.tid == net))
    reborn = dataclasses.replace(next(t for t in universe(srv, kthreads=False) if t.tid == net),
                                 start_time=old.start_time + 1)
    backend.on_new_threads([reborn])
    backend.forget_threads([net], {net: reborn})
    assert backend.ledger.get(net, old.start_time) is None
    assert backend.ledger.get(net, reborn.start_time) is not None


def test_thread_inherits_treatment_but_keeps_true_original(tmp_path, children, backends):
    srv = children.spawn(["hot-0"])
    backend = backends(tmp_path)
    plan = LayerPlan(layers=(layer("srv.hot", CONFINED, EXCLUSIVE, tids=[srv.threads["hot-0"]], pids=[srv.pid],
                                   cpus=[EXCL_CPU], comm=["hot-*"]),), reserve_cpus=(0,))
    backend.apply(plan, universe(srv, kthreads=False))
    # The main thread was kept off CPU 1; a thread it creates now inherits that.
    helper = srv.spawn("helper")
    assert cpus_allowed(srv.pid, helper) == _rest()
    backend.on_new_threads([t for t in scan_threads([srv.pid]) if t.tid == helper])
    backend.stop()
    assert cpus_allowed(srv.pid, helper) == format_cpulist(frozenset(online_cpus()))


def test_thread_leaving_a_layer_gets_its_originals_back(tmp_path, children, backends, server):
    srv, job, batch, other = server
    backend = backends(tmp_path)
    plan = full_plan(srv, job, batch)
    threads = universe(*server, kthreads=False)
    backend.apply(plan, threads)
    net = srv.threads["net-io"]
    assert nice_of(srv.pid, net) == -5
    # Replan: net-io is no longer a member, and the exclusive layer is gone.
    smaller = LayerPlan(layers=(plan.layer("job.bg"), plan.layer("batch.bt")), reserve_cpus=(0,))
    result = backend.apply(smaller, threads)
    assert not result.failed, result.errors
    assert result.restored.get("nice", 0) >= 1 and result.restored.get("affinity", 0) >= 1
    full = format_cpulist(frozenset(online_cpus()))
    assert (cpus_allowed(srv.pid, net), nice_of(srv.pid, net)) == (full, 0)
    assert cpus_allowed(srv.pid, srv.threads["hot-0"]) == full
    assert policy_of(job.pid, job.threads["bg-a"]) == sched.SCHED_IDLE  # still a member


def test_drift_is_counted_once_and_not_fought(tmp_path, children, backends, server):
    srv, job, batch, other = server
    backend = backends(tmp_path)
    plan = full_plan(srv, job, batch)
    threads = universe(*server, kthreads=False)
    backend.apply(plan, threads)
    net = srv.threads["net-io"]
    os.setpriority(os.PRIO_PROCESS, net, 3)  # someone else renices the treated thread
    os.sched_setaffinity(other.threads["other-a"], {0, 1})  # and lets a kept-off thread back on CPU 1

    second = backend.apply(plan, threads)
    assert second.drift == {"nice": 1, "affinity": 1}
    assert nice_of(srv.pid, net) == 3  # not re-fought
    assert cpus_allowed(other.pid, other.threads["other-a"]) == "0-1"
    third = backend.apply(plan, threads)
    assert not third.drift and not third.applied.get("nice")
    assert nice_of(srv.pid, net) == 3
    assert backend.drift_counts == {"nice": 1, "affinity": 1}
    assert backend.status() == BackendStatus("native", drift={"nice": 1, "affinity": 1})  # what metrics count
    kinds = {(rec.tid, kind) for rec in backend.ledger.records.values() for kind in rec.drifted}
    assert (net, "nice") in kinds and (other.threads["other-a"], "affinity") in kinds

    stopped = backend.stop()
    assert nice_of(srv.pid, net) == 3  # theirs: left as found, not restored
    assert any("left as found" in n for n in stopped.notes)


def test_gone_threads_are_normal(tmp_path, children, backends, server):
    srv, job, batch, other = server
    backend = backends(tmp_path)
    threads = universe(*server, kthreads=False)
    plan = full_plan(srv, job, batch)
    dead = len(other.tids())
    children.procs.remove(other.proc)
    other.proc.kill()
    other.proc.wait()
    result = backend.apply(plan, threads)  # a list that still names the dead process's threads
    assert not result.failed and not result.errors
    assert result.gone == dead
    job.proc.kill()
    job.proc.wait()
    stopped = backend.stop()
    assert not stopped.failed and stopped.gone >= len(job.threads)


APPLIER = r"""
import json, sys, time
from temperd.backends.native.backend import NativeBackend, scan_threads
from temperd.backends.native.cgroup_weight import CgroupWeights, WeightSupport
from temperd.plan import CONFINED, EXCLUSIVE, LATENCY, OPEN, YIELD, Layer, LayerPlan, MemberSelector
from temperd.backends.native.pmqos import PmQos
state_dir, spec = sys.argv[1], json.loads(sys.argv[2])
def L(name, kind, treatment, tids, **kw):
    return Layer(name=name, kind=kind, treatment=treatment, tier="critical", workload="w", group=name,
                 selector=MemberSelector(tids=tuple(tids)), **kw)
plan = LayerPlan(layers=(
    L("hot", CONFINED, EXCLUSIVE, spec["hot"], cpus=(1,), ownership=spec["ownership"], slice_us=100),
    L("net", OPEN, LATENCY, spec["net"], nice=-5),
    L("bg", OPEN, YIELD, spec["bg"], policy="idle"),
), reserve_cpus=(0,))
backend = NativeBackend(state_dir, pmqos=PmQos(state_dir + "/no-sysfs"),
                        weights=CgroupWeights(WeightSupport(None, None, "off")))
result = backend.apply(plan, scan_threads(spec["pids"]))
print(json.dumps({"failed": result.failed, "applied": result.applied}), flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("ownership", [FENCED, OWNED])
def test_restore_after_kill_9_of_the_applier(tmp_path, children, backends, server, ownership):
    srv, job, batch, other = server
    kids = (srv, job, other)
    before = {k.pid: snapshot(k.pid) for k in kids}
    spec = {"hot": [srv.threads["hot-0"]], "net": [srv.threads["net-io"]], "bg": job.tids(),
            "pids": [k.pid for k in kids], "ownership": ownership}
    applier = subprocess.Popen([sys.executable, "-c", APPLIER, str(tmp_path), json.dumps(spec)],
                               stdout=subprocess.PIPE, text=True)
    try:
        report = read_json_line(applier, 30)
        assert not report["failed"], report
        assert cpus_allowed(srv.pid, srv.threads["hot-0"]) == str(EXCL_CPU)
        assert nice_of(srv.pid, srv.threads["net-io"]) == -5
        assert policy_of(job.pid, job.threads["bg-a"]) == sched.SCHED_IDLE
        slices = sched.slice_support().supported
        if slices:
            assert sched.get_sched(srv.threads["hot-0"]).slice_ns == 100_000
        applier.send_signal(signal.SIGKILL)
        applier.wait(10)
    finally:
        if applier.poll() is None:
            applier.kill()
            applier.wait(10)
        applier.stdout.close()
    # kill -9 restores nothing: the changes are still there, and so is the state file. Owned: the
    # others were never kept off the exclusive CPU.
    fenced = ownership == FENCED
    assert cpus_allowed(other.pid, other.threads["other-a"]) == (_rest() if fenced else before[other.pid][
        other.threads["other-a"]][0])
    state = tmp_path / "native-state.json"
    assert state.exists()

    fresh = backends(tmp_path)
    result = fresh.recover()
    assert not result.failed, result.errors
    assert result.restored["affinity"] >= (len(srv.tids()) + len(job.tids()) + len(other.tids()) if fenced else 1)
    assert result.restored["nice"] == 1 and result.restored["policy"] == len(job.tids())
    if slices:
        assert result.restored.get("slice", 0) == 1
        assert sched.get_sched(srv.threads["hot-0"]).slice_ns == sched.slice_support().default_ns
    assert {k.pid: snapshot(k.pid) for k in kids} == before
    assert not state.exists()


def test_recover_touches_only_threads_still_alive(tmp_path, children, backends):
    srv = children.spawn(["rec-a", "rec-b"])
    gone = children.spawn(["rec-gone"])
    applier = make_backend(tmp_path)
    plan = LayerPlan(layers=(layer("lat", OPEN, LATENCY, tids=srv.tids() + gone.tids(), nice=-3),), reserve_cpus=(0,))
    applier.apply(plan, universe(srv, gone, kthreads=False))
    applier.ledger.save()  # what a killed run leaves behind (the object is dropped without stop())
    gone_tids = gone.tids()
    children.procs.remove(gone.proc)
    gone.proc.kill()
    gone.proc.wait()
    result = backends(tmp_path).recover()
    assert result.restored["nice"] == len(srv.tids()) and result.gone == len(gone_tids)
    assert all(nice_of(srv.pid, t) == 0 for t in srv.tids())
    if autogroup_enabled():  # the whole session was the latency layer's: its autogroup was reniced too
        assert result.restored[AUTOGROUP] == 1 and read_autogroup(srv.pid)[1] == 0


def test_unreadable_state_file_is_set_aside_and_reported(tmp_path, backends):
    (tmp_path / "native-state.json").write_text("{garbage")
    result = backends(tmp_path).recover()
    assert any("unreadable state file" in e for e in result.errors)
    assert (tmp_path / "native-state.json.unreadable").exists()
    assert not (tmp_path / "native-state.json").exists()


def test_first_apply_recovers_a_left_state_file(tmp_path, children, backends):
    srv = children.spawn(["lft-a"])
    tid = srv.threads["lft-a"]
    crashed = make_backend(tmp_path)
    plan = LayerPlan(layers=(layer("lat", OPEN, LATENCY, tids=[tid], nice=-4),), reserve_cpus=(0,))
    crashed.apply(plan, universe(srv, kthreads=False))
    assert nice_of(srv.pid, tid) == -4
    # A new run that never calls recover() explicitly still starts from the true originals.
    fresh = backends(tmp_path)
    result = fresh.apply(LayerPlan(layers=(), reserve_cpus=(0,)), universe(srv, kthreads=False))
    assert result.restored.get("nice") == 1
    assert nice_of(srv.pid, tid) == 0


# ---- autogroups ----------------------------------------------------------------------------------

needs_autogroup = pytest.mark.skipif(not autogroup_enabled(), reason="kernel.sched_autogroup_enabled is 0")


def _autogroup_nice(pid):
    return read_autogroup(pid)[1]


@needs_autogroup
def test_whole_yield_session_gets_autogroup_nice_and_mixed_one_keeps_its_own(tmp_path, children, backends):
    job = children.spawn(["bg-a", "bg-b"])  # its own session, all yield
    mixed = children.spawn(["srv-a", "bg-c"])  # one session: a yield thread and an untreated one
    plan = LayerPlan(layers=(
        layer("bg", OPEN, YIELD, tids=job.tids() + [mixed.threads["bg-c"]], policy="idle", tier="background"),
    ), reserve_cpus=(0,))
    backend = backends(tmp_path)
    result = backend.apply(plan, universe(job, mixed, kthreads=False))
    assert result.applied[AUTOGROUP] == 1
    assert _autogroup_nice(job.pid) == 19
    assert _autogroup_nice(mixed.pid) == 0  # its yield thread is placed apart (test_idle_cgroup.py)
    backend.stop()
    assert _autogroup_nice(job.pid) == 0


@needs_autogroup
def test_yield_treatment_holds_against_a_spinner_in_another_session(tmp_path, children, backends):
    """The mechanism, measured: a yield spinner and a normal spinner in two sessions share CPU 1."""
    pinned = {EXCL_CPU}
    spin_s = 6.0  # outlasts the window on a crowded host
    fg = children.spawn(["fg-spin"], spin_s=spin_s)
    bg = children.spawn(["bg-spin"], spin_s=spin_s)
    for kid in (fg, bg):
        for tid in kid.tids():
            os.sched_setaffinity(tid, pinned)
    plan = LayerPlan(layers=(layer("bg", OPEN, YIELD, tids=bg.tids(), pids=[bg.pid], catch_all=True,
                                   policy="idle", tier="background"),), reserve_cpus=(0,))
    backend = backends(tmp_path)
    backend.apply(plan, universe(bg, kthreads=False))
    used = ticks_used_until([fg.pid, bg.pid], 100)  # 1 s of the CPU they share
    share = used[bg.pid] / max(1, used[fg.pid] + used[bg.pid])
    # SCHED_IDLE alone would leave the two sessions at ~50/50 here; with the autogroup at nice 19 the
    # yield spinner gets a few percent.
    assert share < 0.15, used


# ---- PM QoS through the backend (scratch sysfs tree) --------------------------------------------


def _qos_tree(root, cpus):
    for cpu in cpus:
        power = root / f"cpu{cpu}" / "power"
        power.mkdir(parents=True)
        (power / "pm_qos_resume_latency_us").write_text("0\n")
    return PmQos(str(root))


def test_idle_resume_bound_on_confined_cpus_only_and_undone_after_a_crash(tmp_path, children, backends):
    srv = children.spawn(["hot-0", "net-io"])
    sysfs = tmp_path / "sys"
    plan = LayerPlan(layers=(
        layer("hot", CONFINED, EXCLUSIVE, tids=[srv.threads["hot-0"]], cpus=[EXCL_CPU], idle_resume_us=0),
        layer("net", OPEN, LATENCY, tids=[srv.threads["net-io"]], nice=-2, idle_resume_us=10),
    ), reserve_cpus=(0,))
    crashed = make_backend(tmp_path / "state", pmqos=_qos_tree(sysfs, [0, 1]))
    result = crashed.apply(plan, universe(srv, kthreads=False))
    assert result.applied["pmqos"] == 1
    assert (sysfs / "cpu1/power/pm_qos_resume_latency_us").read_text() == "n/a"
    assert (sysfs / "cpu0/power/pm_qos_resume_latency_us").read_text().strip() == "0"  # Open layer: not host-wide
    assert any("Open layer owns no CPUs" in n for n in result.notes)
    # Dropped without stop(), as a kill would: the next run puts the bound back from the state file.
    fresh = backends(tmp_path / "state", pmqos=PmQos(str(sysfs)))
    recovered = fresh.recover()
    assert recovered.restored["pmqos"] == 1
    assert (sysfs / "cpu1/power/pm_qos_resume_latency_us").read_text() == "0"
    assert cpus_allowed(srv.pid, srv.threads["hot-0"]) == format_cpulist(frozenset(online_cpus()))


def test_idle_resume_bound_for_open_layers_when_asked(tmp_path, children, backends):
    srv = children.spawn(["net-io"])
    sysfs = tmp_path / "sys"
    backend = backends(tmp_path / "state", pmqos=_qos_tree(sysfs, sorted(frozenset(online_cpus()))), pmqos_open_layers=True)
    plan = LayerPlan(layers=(layer("net", OPEN, LATENCY, tids=[srv.threads["net-io"]], idle_resume_us=10),),
                     reserve_cpus=(0,))
    assert backend.apply(plan, universe(srv, kthreads=False)).applied["pmqos"] == len(frozenset(online_cpus()))
    assert backend.stop().restored["pmqos"] == len(frozenset(online_cpus()))


def _kthreads_named(prefix, cpus):
    out = []
    for t in scan_threads():
        if t.is_kernel_thread and t.comm.startswith(prefix):
            try:
                if sched.get_affinity(t.tid) == frozenset(cpus):
                    out.append(t)
            except OSError:
                continue
    return out


def test_kernel_threads_refusing_or_bound_elsewhere_are_left_alone(tmp_path, children, backends):
    """kthreadd moves; workqueue workers refuse (EINVAL: unmovable, not a failure); a per-CPU kernel thread
    of another CPU is not touched, and is not 'restored' to its creator kthreadd's original either."""
    srv = children.spawn(["hot-0"])
    full = frozenset(online_cpus())
    kthreadd = [t for t in scan_threads([2])]
    refusing = _kthreads_named("kworker/u", full)[:3]
    bound0 = _kthreads_named("ksoftirqd/0", {0})
    if not kthreadd or not refusing or not bound0:
        pytest.skip("this kernel has no kthreadd, unbound kworkers or ksoftirqd/0 to look at")
    before = {t.tid: sched.get_affinity(t.tid) for t in kthreadd + refusing + bound0}
    plan = LayerPlan(layers=(layer("hot", CONFINED, EXCLUSIVE, tids=[srv.threads["hot-0"]], cpus=[EXCL_CPU]),),
                     reserve_cpus=(0,))
    backend = backends(tmp_path)
    result = backend.apply(plan, universe(srv, kthreads=False) + kthreadd + refusing + bound0)
    assert not result.failed and not result.errors, result.errors
    assert sched.get_affinity(2) == full - {EXCL_CPU}
    assert result.unmovable >= len(refusing)
    assert any("refused to leave" in n for n in result.notes)
    again = backend.apply(plan, universe(srv, kthreads=False) + kthreadd + refusing + bound0)
    assert again.unmovable == result.unmovable and not again.applied  # still reported, not retried
    held = {rec.tid for rec in backend.ledger.records.values()}
    assert 2 in held and not held & {t.tid for t in refusing + bound0}
    stopped = backend.stop()
    assert not stopped.failed, stopped.errors
    for tid, cpus in before.items():
        if procfs.read_thread_stat(tid) is not None:  # workqueue workers come and go
            assert sched.get_affinity(tid) == cpus, tid


def test_a_refused_setting_is_reported_once_per_plan(tmp_path, children, backends):
    srv = children.spawn(["hot-0"])
    absent = max(frozenset(online_cpus())) + 64  # a CPU this host does not have: the kernel says EINVAL
    plan = LayerPlan(layers=(layer("hot", CONFINED, EXCLUSIVE, tids=[srv.threads["hot-0"]], cpus=[absent]),),
                     reserve_cpus=(0,))
    backend = backends(tmp_path)
    first = backend.apply(plan, universe(srv, kthreads=False))
    assert first.failed == {"affinity": 1}
    assert f"tid {srv.threads['hot-0']} (hot-0): setting affinity: Invalid argument" in first.errors
    second = backend.apply(plan, universe(srv, kthreads=False))
    assert not second.failed and not second.errors  # not retried under the same plan
    assert cpus_allowed(srv.pid, srv.threads["hot-0"]) == format_cpulist(frozenset(online_cpus()))


def test_ended_threads_leave_the_backends_picture_between_whole_applies(backends, server, children, tmp_path):
    """Under an unchanged plan the host's picture (what the autogroup pass walks) keeps the size
    of the host: threads that ended are dropped, not kept until the next whole apply."""
    from temperd.daemon.daemon import _ended_threads
    from temperd.sources.changes import EXIT, NEW_PROCESS, Change

    srv, job, batch, other = server
    backend = backends(tmp_path)
    backend.apply(full_plan(srv, job, batch), universe(srv, job, batch, other, kthreads=False))
    late = children.spawn(["pic-late"])
    backend.on_new_threads(scan_threads([late.pid]))
    everyone = {tid for kid in (srv, job, batch, other, late) for tid in kid.tids()}
    assert {tid for tid, _start in backend._universe} == everyone

    ended = [Change(EXIT, other.pid, tid) for tid in other.tids() if tid != other.pid] + [Change(EXIT, other.pid)]
    backend.forget_threads(_ended_threads(ended + [Change(NEW_PROCESS, late.pid)]))
    assert {tid for tid, _start in backend._universe} == everyone - set(other.tids())
