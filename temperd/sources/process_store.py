"""The inventory's store: every known process with its threads, and the immutable snapshots
the matcher and planner read. It knows how to read one whole process from /proc; when to read
(events, scans, rechecks) is the inventory's business."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from types import MappingProxyType
from typing import Callable, Dict, FrozenSet, Iterable, Mapping, Optional, Set, Tuple

from temperd.sources import cgroups, procfs
from temperd.sources.change_log import ChangeLog
from temperd.sources.facts import OnDemand, ProcessFacts, ThreadFacts
from temperd.sources.light import LightRecord, Probe

ZOMBIE_STATES = ("Z", "X", "x")


@dataclass(frozen=True)
class InventorySnapshot:
    """An immutable view for the matcher and planner."""

    processes: Mapping[int, ProcessFacts]
    threads: Mapping[int, ThreadFacts]
    generation: int

    def process(self, pid: int) -> Optional[ProcessFacts]:
        return self.processes.get(pid)

    def thread(self, tid: int) -> Optional[ThreadFacts]:
        return self.threads.get(tid)


class ProcessStore:
    """Processes by pid, and which process each thread id belongs to. Every change bumps
    `generation`, so a snapshot is rebuilt only after something changed."""

    def __init__(self) -> None:
        self.procs: Dict[int, "ProcessRecord"] = {}
        self.tid_pid: Dict[int, int] = {}
        self.generation = 0
        self._cached: Optional[InventorySnapshot] = None
        self._tables: Tuple[Dict[int, ProcessFacts], Dict[int, ThreadFacts]] = ({}, {})  # the dicts behind _cached
        self._changed: Set[int] = set()  # pids touched, installed or removed since the cached snapshot
        self._log = ChangeLog()  # the pids each snapshot made again: changed_since's
        # Each cgroup's CPU quota, read once between scans (a scan clears it: an operator may have
        # set one since): the processes of a fork storm share a cgroup, and each new one otherwise
        # opened up to four files for it.
        self.quotas = functools.cache(cgroups.cpu_quota)
        self.light: Dict[int, LightRecord] = {}  # processes not tracked: no thread of theirs is read
        self.removed: Callable[[int], None] = lambda pid: None  # told of each tracked process removed

    def process(self, pid: int) -> Optional[ProcessFacts]:
        proc = self.procs.get(pid)
        return proc.freeze() if proc is not None else None

    def thread(self, tid: int) -> Optional[ThreadFacts]:
        pid = self.tid_pid.get(tid)
        if pid is None:
            return None
        return self.procs[pid].threads.get(tid)

    def snapshot(self) -> InventorySnapshot:
        """The processes and threads now. The previous snapshot's tables are copied and only the
        processes changed since are made again (a fork storm's batch touches a few dozen of a
        host's thousands)."""
        snap = self._cached
        if snap is not None and snap.generation == self.generation:
            return snap
        if snap is None:
            processes: Dict[int, ProcessFacts] = {}
            threads: Dict[int, ThreadFacts] = {}
            changed: Iterable[int] = [*self.procs, *self.light]
            self._log.clear()
        else:
            # dict.copy() of the tables behind the snapshot: a block copy (dict(proxy) went key by key).
            processes, threads, changed = self._tables[0].copy(), self._tables[1].copy(), self._changed
        for pid in changed:
            old = processes.pop(pid, None)
            proc = self.procs.get(pid)
            facts = proc.freeze() if proc is not None else self.light[pid].freeze() if pid in self.light else None
            if facts is not None:
                processes[pid] = facts
                threads.update(facts.threads.items())  # a proxy's items: dict.update(proxy) goes key by key
            if old is not None:
                # Only the threads the process no longer has: a fork storm's creator holds
                # thousands and changes a few per batch.
                gone = old.threads.keys() - facts.threads.keys() if facts is not None else old.threads.keys()
                for tid in gone:
                    if threads.get(tid) is old.threads[tid]:
                        del threads[tid]
        if snap is not None:
            self._log.add(snap.generation, self.generation, changed)
        self._changed = set()
        snap = InventorySnapshot(MappingProxyType(processes), MappingProxyType(threads), self.generation)
        self._cached, self._tables = snap, (processes, threads)
        return snap

    def changed_since(self, generation: Optional[int]) -> Optional[FrozenSet[int]]:
        """The pids whose facts differ between the snapshot of `generation` and the latest one
        (snapshot() first), or None where that snapshot is too old to say (then compare all)."""
        return self._log.since(generation, self._cached.generation) if self._cached is not None else None

    # -- changes ------------------------------------------------------------------------------

    def touch(self, proc: ProcessRecord) -> None:
        proc.frozen = None
        self._changed.add(proc.pid)
        self.generation += 1

    def put_thread(self, proc: ProcessRecord, info: ThreadFacts) -> None:
        proc.threads[info.tid] = info
        self.tid_pid[info.tid] = proc.pid
        if info.tid == proc.pid:
            proc.name = info.comm

    def drop_thread(self, proc: ProcessRecord, tid: int) -> None:
        proc.threads.pop(tid, None)
        if self.tid_pid.get(tid) == proc.pid:
            del self.tid_pid[tid]

    def put_light(self, record: LightRecord) -> None:
        """An untracked process (replacing whatever the store knew under its pid)."""
        if record.pid in self.procs:
            self.remove_process(record.pid)
        self.light[record.pid] = record
        self._changed.add(record.pid)
        self.generation += 1

    def drop_light(self, pid: int) -> None:
        if self.light.pop(pid, None) is not None:
            self._changed.add(pid)
            self.generation += 1

    def remove_process(self, pid: int) -> None:
        proc = self.procs.pop(pid, None)
        if proc is None:
            self.drop_light(pid)
            return
        self.removed(pid)
        for tid in proc.threads:
            if self.tid_pid.get(tid) == pid:
                del self.tid_pid[tid]
        self._changed.add(pid)
        self.generation += 1

    def refresh_runtime(self, pids: Iterable[int]) -> int:
        """Read the CPU time of every thread of these processes; how many threads had vanished."""
        vanished = 0
        for pid in pids:
            proc = self.procs.get(pid)
            if proc is None:
                continue
            changed = False
            for tid, info in list(proc.threads.items()):
                stat = procfs.read_schedstat(pid, tid)
                if stat is None:
                    vanished += 1
                    continue
                if stat.run_ns != info.runtime_ns:
                    proc.threads[tid] = dataclasses.replace(info, runtime_ns=stat.run_ns)
                    changed = True
            if changed:
                self.touch(proc)
        return vanished

    def install(self, proc: ProcessRecord) -> None:
        old = self.procs.get(proc.pid)
        if old is not None:
            self.remove_process(proc.pid)
        self.light.pop(proc.pid, None)
        self.procs[proc.pid] = proc
        for tid in proc.threads:
            self.tid_pid[tid] = proc.pid
        self._changed.add(proc.pid)
        self.generation += 1

    def read_process(self, pid: int, stats: Optional[Dict[int, procfs.TaskStat]] = None,
                     limit: Optional[int] = None, probe: Optional[Probe] = None,
                     leader: Optional[procfs.TaskStat] = None) -> Optional[ProcessRecord]:
        """A whole process from /proc (at most `limit` of its threads, leader first); None if it
        is gone or only a zombie is left. probe: what the candidate gate read of it just now, not read again.
        leader: its leader's stat read just now. Without stats, the leader's stat is read first: a
        process it says has one thread (as an exec leaves it) is not listed."""
        if stats is None:
            stats = only_thread(pid, leader if leader is not None else procfs.read_task_stat(pid, pid))
        if stats is None:
            stats = procfs.read_thread_stats(pid) if limit is None else read_some_stats(pid, limit)
            if stats is None:
                return None
        leader = stats.get(pid)
        if leader is None:
            return None
        proc = ProcessRecord(pid, leader, self.quotas)
        for tid, stat in stats.items():
            info = thread_facts(pid, tid, stat, None)
            if info is not None:
                proc.threads[tid] = info
        if not proc.threads:
            return None
        proc.read_static(probe)
        return proc


class ProcessRecord:
    """The mutable record behind a ProcessFacts (frozen on demand, cached until it changes)."""

    __slots__ = (
        "pid", "start_time", "name", "exe", "cmdline", "cgroup", "cgroup_systemd",
        "unit", "is_kernel_thread", "ppid", "threads", "frozen", "uid", "execs", "on_demand", "unreadable", "quotas",
    )

    def __init__(self, pid: int, stat: procfs.TaskStat, quotas: Callable[[str], Optional[float]]):
        self.pid = pid
        self.start_time = stat.start_time
        self.name = stat.comm
        self.ppid = stat.ppid
        self.is_kernel_thread = procfs.is_kernel_thread(pid, stat)
        self.exe: Optional[str] = None
        self.cmdline: Tuple[str, ...] = ()
        self.cgroup: Optional[str] = None
        self.cgroup_systemd: Optional[str] = None
        self.unit: Optional[str] = None
        self.uid: Optional[int] = None
        self.execs = 0
        self.threads: Dict[int, ThreadFacts] = {}
        self.frozen: Optional[ProcessFacts] = None
        self.quotas = quotas  # the store's, shared
        self.on_demand = _on_demand(pid, quotas)
        self.unreadable: Tuple[str, ...] = ()

    def exec_seen(self) -> None:
        """An exec found by a scan (its event lost): a new program image, its facts read anew."""
        self.execs += 1
        self.on_demand = _on_demand(self.pid, self.quotas)

    def live_tid(self) -> Optional[int]:
        """The thread to read process facts through: None (the process) unless the leader is gone."""
        if self.pid in self.threads or not self.threads:
            return None
        return next(iter(self.threads))

    def read_static(self, probe: Optional[Probe] = None) -> None:
        """exe, cmdline and owner: read when the process appears, execs or a scan rechecks. A fact
        the kernel denies is named in `unreadable` (the process is there; its fact is not ours to
        read), one of a process that is gone is left unknown. probe: the facts the candidate gate
        found of this process within this pass (a new process's status file is the costliest read)."""
        pid = self.pid
        via = self.live_tid()
        denied: Set[str] = set()
        found = probe.found if probe is not None else _none
        if not self.is_kernel_thread:
            self.exe = found("exe") or _fact(procfs.read_exe, "exe", denied, pid, via)
            self.cmdline = found("cmdline") or _fact(procfs.read_cmdline, "cmdline", denied, pid, via) or ()
        uid = found("uid")
        self.uid = uid if uid is not None else _fact(procfs.read_uid, "uid", denied, pid, via)
        self.unreadable = tuple(sorted(denied))
        self.set_cgroup(found("cgroup") or procfs.read_cgroup(pid))

    def set_cgroup(self, paths: Optional[procfs.CgroupPaths]) -> None:
        if paths is None:
            return
        self.cgroup = paths.unified
        self.cgroup_systemd = paths.systemd
        self.unit = paths.unit

    def freeze(self) -> ProcessFacts:
        if self.frozen is None:
            self.frozen = ProcessFacts(
                pid=self.pid,
                start_time=self.start_time,
                name=self.name,
                exe=self.exe,
                cmdline=self.cmdline,
                cgroup=self.cgroup,
                cgroup_systemd=self.cgroup_systemd,
                unit=self.unit,
                is_kernel_thread=self.is_kernel_thread,
                ppid=self.ppid,
                threads=MappingProxyType(self.threads.copy()),  # copy(): a block copy where dict() inserts one by one
                uid=self.uid,
                execs=self.execs,
                on_demand=self.on_demand,
                unreadable=self.unreadable,
            )
        return self.frozen


def only_thread(pid: int, leader: Optional[procfs.TaskStat]) -> Optional[Dict[int, procfs.TaskStat]]:
    """{pid: leader} where the leader's stat says its process has no other thread (a new
    program's usual case: exec leaves one); None where the threads must be listed. A thread made
    after that read is told by its own fork event, which comes later."""
    if leader is not None and leader.num_threads == 1:
        return {pid: leader}
    return None


def read_some_stats(pid: int, limit: int) -> Optional[Dict[int, procfs.TaskStat]]:
    """stat of at most `limit` threads of a process, the leader first (a bounded process's)."""
    tids = procfs.list_tids(pid)
    if tids is None:
        return None
    tids.sort()
    stats = {}
    for tid in tids[:max(1, limit)]:
        stat = procfs.read_task_stat(pid, tid)
        if stat is not None:
            stats[tid] = stat
    return stats


def _none(_fact: str) -> None:
    return None


def _fact(read, name: str, denied: set, pid: int, via: Optional[int]):
    """One fact read strictly: None where the process is gone or the fact denied (then named in `denied`)."""
    try:
        return read(pid, via, strict=True)
    except procfs.AccessDenied:
        denied.add(name)
    except procfs.TaskGone:
        pass
    return None


def _on_demand(pid: int, quotas: Callable[[str], Optional[float]]) -> OnDemand:
    return OnDemand(functools.partial(procfs.read_environ_var, pid), quotas)


def thread_facts(pid: int, tid: int, stat: procfs.TaskStat, runtime_ns: Optional[int],
                 affinity: Optional[FrozenSet[int]] = None) -> Optional[ThreadFacts]:
    """A live thread's record; None for a zombie or a thread gone before its affinity was read."""
    if stat.state in ZOMBIE_STATES:
        return None
    if affinity is None:
        affinity = procfs.read_affinity(tid, pid)
        if affinity is None:
            return None
    return ThreadFacts(
        tid=tid,
        pid=pid,
        start_time=stat.start_time,
        comm=stat.comm,
        affinity=affinity,
        policy=stat.policy,
        nice=stat.nice,
        last_cpu=stat.last_cpu,
        is_kernel_thread=procfs.is_kernel_thread(pid, stat),
        runtime_ns=runtime_ns,
    )
