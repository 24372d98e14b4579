"""A creator inside a fork when temperd restores it: the child, not in /proc yet, copies the
treatment the creator had when the fork began. The sweep for inherited treatment that finds
nothing is the last only when no creator may still be inside a fork (its /proc syscall file:
blocked in one, or runnable), so such a child is found and given back the creator's original.
The kernel is tests/fake_kernel.py's: nothing of the host is touched."""

from __future__ import annotations

import dataclasses
import os

import pytest

from fake_kernel import FakeKernel
from temperd.backends.native import inheritance, sched
from temperd.backends.native.inheritance import restore_inherited
from temperd.backends.native.restore_ledger import RestoreLedger
from temperd.backends.native.thread_settings import NICE, POLICY
from temperd.sources import procfs

TREATED = {POLICY: (sched.SCHED_BATCH, 0), NICE: 10}


def _treated_creator(tmp_path, monkeypatch):
    """A thread temperd had put at SCHED_BATCH, nice 10, restored; the ledger from before its restore."""
    kernel = FakeKernel(cpus=range(4))
    kernel.install(monkeypatch)
    kernel.add(100, 100, 5, "bg-fork")
    ledger = RestoreLedger(str(tmp_path), online_cpus=lambda: kernel.cpus)
    rec = ledger.record(100, 100, 5, "bg-fork", since=5)
    rec.originals.update({POLICY: (sched.SCHED_OTHER, 0), NICE: 0})
    kernel.set_sched(100, policy=sched.SCHED_BATCH, nice=10)
    rec.written.update(TREATED)
    creators = ledger.copy()
    ledger.restore_all()
    assert (kernel.threads[100].policy, kernel.threads[100].nice) == (sched.SCHED_OTHER, 0)
    monkeypatch.setattr(inheritance, "FORK_SETTLE_S", 0.0)
    return kernel, ledger, creators


def _child_appears_on_first_look(kernel, monkeypatch, doing):
    """The creator reads as `doing` once; its child, made with the treatment, shows up right after."""
    looks = []

    def syscall(pid, tid):
        looks.append(tid)
        if len(looks) == 1:
            kernel.add(101, 100, 6, "bg-fork")
            kernel.threads[101] = dataclasses.replace(kernel.threads[101], policy=sched.SCHED_BATCH, nice=10)
            return doing
        return -1  # blocked outside a system call: no fork under way

    monkeypatch.setattr(procfs, "task_syscall", syscall)
    return looks


@pytest.mark.parametrize("doing", [min(procfs.FORK_SYSCALLS), procfs.RUNNING], ids=["blocked in fork", "runnable"])
def test_a_child_that_appears_after_an_empty_sweep_is_given_back_the_creators_original(tmp_path, monkeypatch, doing):
    kernel, ledger, creators = _treated_creator(tmp_path, monkeypatch)
    looks = _child_appears_on_first_look(kernel, monkeypatch, doing)
    result = restore_inherited(ledger, creators)
    assert (kernel.threads[101].policy, kernel.threads[101].nice) == (sched.SCHED_OTHER, 0)
    assert result.restored == {POLICY: 1, NICE: 1}
    assert looks[:2] == [100, 100]  # the creator looked at again after the sweep that found its child


def test_a_creator_blocked_elsewhere_ends_the_sweeps_at_the_first_empty_one(tmp_path, monkeypatch):
    kernel, ledger, creators = _treated_creator(tmp_path, monkeypatch)
    looks = []
    monkeypatch.setattr(procfs, "task_syscall", lambda pid, tid: looks.append(tid) or -1)
    assert restore_inherited(ledger, creators).restored == {}
    assert looks == [100]


def test_a_creator_that_stays_runnable_gets_a_bounded_number_of_sweeps(tmp_path, monkeypatch):
    kernel, ledger, creators = _treated_creator(tmp_path, monkeypatch)
    looks = []
    monkeypatch.setattr(procfs, "task_syscall", lambda pid, tid: looks.append(tid) or procfs.RUNNING)
    restore_inherited(ledger, creators)
    assert len(looks) == inheritance.UNSURE_SWEEPS + 1


def test_the_syscall_file_reads_as_a_system_call_number_or_none_where_gone():
    pid = os.getpid()
    assert isinstance(procfs.task_syscall(pid, pid), int)  # itself, reading the file: in read(2)
    assert procfs.task_syscall(2 ** 22 + 1, 2 ** 22 + 1) is None  # no such thread
