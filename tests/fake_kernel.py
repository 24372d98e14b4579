"""A kernel in memory for the native backend's unit tests: each thread's affinity, policy, nice
and slice, read and written through the seams the backend uses (sched.*, procfs.read_thread_stat),
so that whole applies and deltas run as any user, with nothing of the host touched.

    kernel = FakeKernel(cpus=range(8))
    kernel.install(monkeypatch)
    kernel.add(tid, pid, start_time, comm)
"""

from __future__ import annotations

import errno
from dataclasses import dataclass, replace
from typing import Dict, FrozenSet, Iterable, List, Optional

from temperd.backends.native import sched
from temperd.sources import procfs


@dataclass(frozen=True)
class FakeThread:
    pid: int
    start_time: int
    comm: str
    affinity: FrozenSet[int]
    policy: int = sched.SCHED_OTHER
    nice: int = 0
    slice_ns: Optional[int] = None


class FakeKernel:
    def __init__(self, cpus: Iterable[int] = range(8)):
        self.cpus = frozenset(cpus)
        self.threads: Dict[int, FakeThread] = {}
        self.reads: List[int] = []  # tids whose settings were read, in order

    def add(self, tid: int, pid: int, start_time: int, comm: str) -> None:
        """A thread as a process that temperd never treated makes it: the kernel's defaults."""
        self.threads[tid] = FakeThread(pid, start_time, comm, self.cpus)

    def rename(self, tid: int, comm: str) -> None:
        self.threads[tid] = replace(self.threads[tid], comm=comm)

    def remove(self, tid: int) -> None:
        self.threads.pop(tid, None)

    def state(self) -> Dict[int, tuple]:
        return {tid: (t.affinity, t.policy, t.nice, t.slice_ns) for tid, t in self.threads.items()}

    def _get(self, tid: int) -> FakeThread:
        thread = self.threads.get(tid)
        if thread is None:
            raise OSError(errno.ESRCH, "No such process")
        return thread

    def get_affinity(self, tid: int) -> FrozenSet[int]:
        self.reads.append(tid)
        return self._get(tid).affinity

    def set_affinity(self, tid: int, cpus: Iterable[int]) -> None:
        wanted = frozenset(cpus) & self.cpus
        if not wanted:
            raise OSError(errno.EINVAL, "Invalid argument")
        self.threads[tid] = replace(self._get(tid), affinity=wanted)

    def get_sched(self, tid: int) -> sched.SchedState:
        t = self._get(tid)
        return sched.SchedState(policy=t.policy, priority=0, nice=t.nice, slice_ns=t.slice_ns)

    def set_sched(self, tid: int, *, policy: Optional[int] = None, nice: Optional[int] = None,
                  slice_ns: Optional[int] = None, priority: Optional[int] = None) -> None:
        t = self._get(tid)
        self.threads[tid] = replace(t, policy=t.policy if policy is None else policy,
                                    nice=t.nice if nice is None else nice,
                                    slice_ns=t.slice_ns if slice_ns is None else (slice_ns or None))

    def read_thread_stat(self, tid: int) -> Optional[procfs.TaskStat]:
        t = self.threads.get(tid)
        if t is None:
            return None
        return procfs.TaskStat(comm=t.comm, state="S", ppid=1, flags=0, nice=t.nice, start_time=t.start_time,
                               last_cpu=min(t.affinity), policy=t.policy)

    def read_thread_stats(self, pid: int) -> Optional[Dict[int, procfs.TaskStat]]:
        stats = {tid: self.read_thread_stat(tid) for tid, t in self.threads.items() if t.pid == pid}
        return stats or None

    def install(self, monkeypatch) -> None:
        for name in ("get_affinity", "set_affinity", "get_sched", "set_sched"):
            monkeypatch.setattr(sched, name, getattr(self, name))
        monkeypatch.setattr(sched, "set_nice", lambda tid, nice: self.set_sched(tid, nice=nice))
        monkeypatch.setattr(sched, "slice_support",
                            lambda: sched.SliceSupport(False, None, None, None, "not in a fake kernel"))
        monkeypatch.setattr(procfs, "read_thread_stat", self.read_thread_stat)
        monkeypatch.setattr(procfs, "read_thread_stats", self.read_thread_stats)
        monkeypatch.setattr(procfs, "is_kernel_thread", lambda pid, stat: False)
        monkeypatch.setattr(procfs, "list_pids", lambda: sorted({t.pid for t in self.threads.values()}))


__all__ = ["FakeKernel", "FakeThread"]
