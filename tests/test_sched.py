"""Per-thread scheduler controls on real threads, read back from /proc; thread identity; autogroups."""

from __future__ import annotations

import os

import pytest

from temperd.backends.native import sched
from temperd.backends.native.autogroup import autogroup_enabled, read_autogroup
from temperd.backends.native.membership import KernelThreads, ThreadRef
from temperd.backends.native.thread_settings import NICE, ThreadRecord
from temperd.sources import procfs
from thread_children import cpus_allowed, needs_two_cpus, nice_of, policy_of

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="changing other threads' scheduling needs root")


@needs_two_cpus
def test_affinity_is_per_thread(children):
    child = children.spawn(["aff-a", "aff-b"])
    a, b = child.threads["aff-a"], child.threads["aff-b"]
    sched.set_affinity(a, {1})
    assert cpus_allowed(child.pid, a) == "1"
    assert sched.get_affinity(a) == frozenset({1})
    assert cpus_allowed(child.pid, b) == "0-1"  # the sibling keeps its own


@needs_root
def test_policy_and_nice_are_per_thread(children):
    child = children.spawn(["pol-idle", "pol-batch", "pol-nice", "pol-none"])
    t = child.threads
    sched.set_sched(t["pol-idle"], policy=sched.SCHED_IDLE)
    sched.set_sched(t["pol-batch"], policy=sched.SCHED_BATCH, nice=19)
    sched.set_nice(t["pol-nice"], -7)
    assert policy_of(child.pid, t["pol-idle"]) == sched.SCHED_IDLE
    assert (policy_of(child.pid, t["pol-batch"]), nice_of(child.pid, t["pol-batch"])) == (sched.SCHED_BATCH, 19)
    assert (policy_of(child.pid, t["pol-nice"]), nice_of(child.pid, t["pol-nice"])) == (sched.SCHED_OTHER, -7)
    assert (policy_of(child.pid, t["pol-none"]), nice_of(child.pid, t["pol-none"])) == (sched.SCHED_OTHER, 0)
    state = sched.get_sched(t["pol-batch"])
    assert (state.policy, state.nice, state.priority) == (sched.SCHED_BATCH, 19, 0)
    # Back to the defaults: a policy change keeps nice unless told, and a nice change keeps policy.
    sched.set_sched(t["pol-batch"], policy=sched.SCHED_OTHER)
    assert (policy_of(child.pid, t["pol-batch"]), nice_of(child.pid, t["pol-batch"])) == (sched.SCHED_OTHER, 19)
    sched.set_sched(t["pol-batch"], nice=0)
    assert (policy_of(child.pid, t["pol-batch"]), nice_of(child.pid, t["pol-batch"])) == (sched.SCHED_OTHER, 0)


def test_slice_support_is_detected_consistently():
    support = sched.slice_support()
    assert support is sched.slice_support()  # detected once
    assert support.reason
    if support.supported:
        assert support.default_ns and support.min_ns and support.max_ns
        assert support.min_ns <= support.default_ns <= support.max_ns


@needs_root
def test_custom_slice_set_kept_across_policy_change_and_reset(children):
    support = sched.slice_support()
    if not support.supported:
        pytest.skip(f"custom slice unsupported: {support.reason}")
    child = children.spawn(["slc-a", "slc-b"])
    a, b = child.threads["slc-a"], child.threads["slc-b"]
    sched.set_sched(a, slice_ns=300_000)
    assert sched.get_sched(a).slice_ns == 300_000
    assert sched.get_sched(b).slice_ns == support.default_ns
    # A later policy or nice change must not drop the custom slice.
    sched.set_sched(a, policy=sched.SCHED_BATCH, nice=3)
    assert sched.get_sched(a) == sched.SchedState(sched.SCHED_BATCH, 0, 3, 300_000)
    # Requests outside the kernel's range are clamped, and 0 returns to the base slice.
    sched.set_sched(a, slice_ns=1)
    assert sched.get_sched(a).slice_ns == support.min_ns
    sched.set_sched(a, policy=sched.SCHED_OTHER, nice=0, slice_ns=0)
    assert sched.get_sched(a) == sched.SchedState(sched.SCHED_OTHER, 0, 0, support.default_ns)


def test_gone_thread_raises_esrch(children):
    child = children.spawn(["gone-a"])
    tid = child.threads["gone-a"]
    start_time = procfs.read_thread_stat(tid).start_time
    children.kill_all()
    with pytest.raises(OSError) as info:
        sched.get_sched(tid)
    assert sched.is_gone(info.value)
    assert procfs.read_thread_stat(tid) is None
    gone = ThreadRecord(tid, child.pid, start_time, "gone-a")
    assert gone.read(NICE) is None and gone.ended


def test_identity_and_kernel_thread(children):
    """What the backend uses to tell threads apart (tid, start time) and to leave kernel threads be."""
    child = children.spawn(["ident-a"])
    tid = child.threads["ident-a"]
    stat = procfs.read_thread_stat(tid)
    assert stat.start_time == procfs.read_thread_stat(tid).start_time > 0
    assert ThreadRecord(tid, child.pid, stat.start_time, "ident-a").read(NICE) == 0
    assert ThreadRecord(tid, child.pid, stat.start_time - 1, "ident-a").read(NICE) is None  # a recycled tid
    is_kernel_thread = KernelThreads()
    assert is_kernel_thread(ThreadRef(tid, child.pid, stat.start_time, "ident-a")) is False
    kthreadd = procfs.read_thread_stat(2)
    assert is_kernel_thread(ThreadRef(2, 2, kthreadd.start_time, kthreadd.comm)) is True
    assert is_kernel_thread(ThreadRef(tid, child.pid, stat.start_time, "ident-a", is_kernel_thread=True)) is True


def test_autogroup_read_matches_proc(children):
    if not os.path.exists(f"/proc/{os.getpid()}/autogroup"):
        pytest.skip("kernel built without CONFIG_SCHED_AUTOGROUP")
    child = children.spawn(["ag-a"], new_session=True)
    mine, theirs = read_autogroup(os.getpid()), read_autogroup(child.pid)
    assert theirs is not None  # a process that leads its own session has its own autogroup
    with open(f"/proc/{child.pid}/autogroup") as handle:
        assert handle.read().split()[0] == theirs[0]
    if autogroup_enabled():
        # A new session is a new autogroup. This test may itself run in the root autogroup
        # (init's session: the kernel prints nothing for it, so mine is None).
        assert mine is None or mine[0] != theirs[0]
