"""The index of creators that the native backend keeps across passes over new threads
(inheritance.Creators.follow): a value temperd wrote on a thread after its process was indexed is
found on the threads that thread makes later, and a process's index is built afresh before its
stale entries outnumber its live ones. The kernel is tests/fake_kernel.py's: nothing of the host is touched."""

from __future__ import annotations

import dataclasses

from fake_kernel import FakeKernel
from temperd.backends.native import sched
from temperd.backends.native.backend import NativeBackend
from temperd.backends.native.cgroup_weight import CgroupWeights, WeightSupport
from temperd.backends.native.idle_cgroup import IdleCgroup
from temperd.backends.native.inheritance import Creators
from temperd.backends.native.membership import ThreadRef
from temperd.backends.native.pmqos import PmQos
from temperd.backends.native.thread_settings import NICE
from temperd.sources import procfs
from temperd.plan import LATENCY, OPEN, YIELD, Layer, LayerPlan, MemberSelector

PID = 1000


def _layer(name, treatment, comm, **kw) -> Layer:
    return Layer(name=name, kind=OPEN, treatment=treatment, tier="background", workload="w", group=name,
                 selector=MemberSelector(pids=(PID,), tids=(), comm_patterns=(comm,), catch_all=False), **kw)


def _made_by(kernel, creator, tid, comm):
    """A thread `creator` makes now: the creator's settings, as the kernel copies them."""
    start = procfs.boot_ticks() + 1
    kernel.add(tid, PID, start, comm)
    made = kernel.threads[creator]
    kernel.threads[tid] = dataclasses.replace(kernel.threads[tid], policy=made.policy, nice=made.nice)
    return ThreadRef(tid, PID, start, comm, False)


def test_a_value_written_after_its_process_was_indexed_is_found_on_the_threads_made_with_it(tmp_path, monkeypatch):
    kernel = FakeKernel(cpus=range(4))
    kernel.install(monkeypatch)
    backend = NativeBackend(str(tmp_path), weights=CgroupWeights(WeightSupport(None, None, "off")),
                            pmqos=PmQos(str(tmp_path / "none")), autogroup=False, idle_cgroup=IdleCgroup(why_not="off"),
                            online_cpus=lambda: kernel.cpus)
    plan = LayerPlan(layers=(_layer("y", YIELD, "chw-*", policy="batch", nice=5),
                             _layer("lat", LATENCY, "lat-*", nice=-3)), reserve_cpus=(0,))
    kernel.add(PID, PID, PID, "main")
    kernel.add(1001, PID, 1001, "lat-e")
    backend.apply(plan, [ThreadRef(PID, PID, PID, "main", False), ThreadRef(1001, PID, 1001, "lat-e", False)])
    # The process is indexed as it holds lat-e alone; chw-c, made at nice 2, is treated in that pass.
    kernel.set_sched(PID, nice=2)
    backend.apply(plan, {}, [_made_by(kernel, PID, 1002, "chw-c")])
    assert (kernel.threads[1002].policy, kernel.threads[1002].nice) == (sched.SCHED_BATCH, 5)
    # A thread chw-c makes carries its treatment: chw-c's original comes back, as no layer wants it.
    backend.apply(plan, {}, [_made_by(kernel, 1002, 1003, "plain")])
    assert (kernel.threads[1003].policy, kernel.threads[1003].nice) == (sched.SCHED_OTHER, 2)


def test_a_process_index_is_built_afresh_once_its_changes_outnumber_it(tmp_path, monkeypatch):
    kernel = FakeKernel(cpus=range(4))
    kernel.install(monkeypatch)
    backend = NativeBackend(str(tmp_path), online_cpus=lambda: kernel.cpus, autogroup=False,
                            idle_cgroup=IdleCgroup(why_not="off"))
    ledger = backend.ledger
    creators = Creators(ledger, kernel.cpus, ledger.given_back)
    creators.follow(kernel.cpus)
    rec = ledger.record(PID, PID, PID, "main", since=1)
    rec.originals[NICE], rec.written[NICE] = 0, 5
    assert creators.find(PID, ThreadRef(PID + 1, PID, PID + 1, "t", False), NICE, 5, {}) == (0, 5)
    for nice in range(6, 6 + 2 + 64):  # 2 x 1 record + 64 changes
        rec.written[NICE] = nice % 20
        creators.follow(kernel.cpus)
    assert creators.find(PID, ThreadRef(PID + 1, PID, PID + 1, "t", False), NICE, rec.written[NICE], {}) == \
        (0, rec.written[NICE])
    assert sum(len(same.records) for same in creators._index.get(PID, {}).get(NICE, {}).values()) <= 2 + 64 + 1
