"""Facts without processes: ProcessFacts and ThreadFacts built in memory for the matcher, the
planner and the backends' pure parts, so that their cases run as any user, in milliseconds.

    host = FactsHost()
    db = host.process("postgres", exe="/usr/lib/postgresql/16/bin/postgres", unit="postgresql.service",
                      threads=["postgres", "walwriter"], uid=0)
    host.process("postgres", ppid=db.pid, cmdline=("postgres: app db [local] idle",))
    result = matcher.match(host.processes)

Every process gets fresh pids and tids (its leader's tid is its pid), start time 1 unless given,
and what an environment binding or a budget needs as given (`environ`, `quota`): nothing is read.
"""

from __future__ import annotations

import itertools
from types import MappingProxyType
from typing import Dict, FrozenSet, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from temperd.config.profile import Profile, parse_profile
from temperd.sources.facts import OnDemand, ProcessFacts, ThreadFacts
from temperd.sources.procfs import unit_from_cgroup

ALL_CPUS = frozenset((0, 1))


def thread(tid: int, comm: str, *, pid: Optional[int] = None, start_time: int = 1,
           affinity: FrozenSet[int] = ALL_CPUS, policy: int = 0, nice: int = 0, last_cpu: int = 0,
           runtime_ns: Optional[int] = None, kernel: bool = False) -> ThreadFacts:
    return ThreadFacts(tid=tid, pid=tid if pid is None else pid, start_time=start_time, comm=comm,
                       affinity=frozenset(affinity), policy=policy, nice=nice, last_cpu=last_cpu,
                       is_kernel_thread=kernel, runtime_ns=runtime_ns)


def process(pid: int, name: str, *, threads: Sequence[Union[str, ThreadFacts]] = (), exe: Optional[str] = None,
            cmdline: Sequence[str] = (), cgroup: Optional[str] = None, unit: Optional[str] = None,
            ppid: int = 1, uid: Optional[int] = 0, start_time: int = 1, execs: int = 0, kernel: bool = False,
            environ: Optional[Mapping[str, str]] = None, quota: Optional[float] = None,
            first_tid: Optional[int] = None) -> ProcessFacts:
    """One process. `threads`: names (the first is the leader, tid = pid; the rest get tids from
    `first_tid`, default pid + 1) or ThreadFacts; none given: the leader alone, named `name`.
    `unit` defaults to the one `cgroup` names; `quota` is the cgroup's CPU quota in CPUs."""
    built: Dict[int, ThreadFacts] = {}
    tids = itertools.count(first_tid if first_tid is not None else pid + 1)
    for index, item in enumerate(threads or [name]):
        if isinstance(item, ThreadFacts):
            built[item.tid] = item
            continue
        tid = pid if index == 0 else next(tids)
        built[tid] = thread(tid, item, pid=pid, start_time=start_time, kernel=kernel)
    quotas = {cgroup: quota} if cgroup and quota is not None else {}
    return ProcessFacts(pid=pid, start_time=start_time, name=name, exe=exe, cmdline=tuple(cmdline), cgroup=cgroup,
                        cgroup_systemd=None, unit=unit if unit is not None else unit_from_cgroup(cgroup),
                        is_kernel_thread=kernel, ppid=ppid, threads=MappingProxyType(built), uid=uid, execs=execs,
                        on_demand=OnDemand.known(environ, quotas))


def profile(profile_id: str, fingerprint: str, *groups: str) -> Profile:
    """A profile from its fingerprint's TOML lines and each thread group's."""
    text = "\n".join([f'schema_version = 1\nid = "{profile_id}"\n[fingerprint]', fingerprint,
                      *(f"[[thread_groups]]\n{group}" for group in groups)])
    return parse_profile(text, f"{profile_id}.toml")


class FactsHost:
    """A host's processes, built one by one with pids and tids that never collide."""

    def __init__(self, first_pid: int = 1000, stride: int = 100):
        self._pids = itertools.count(first_pid, stride)
        self.by_pid: Dict[int, ProcessFacts] = {}

    def process(self, name: str, **facts) -> ProcessFacts:
        pid = facts.pop("pid", None) or next(self._pids)
        proc = process(pid, name, **facts)
        self.by_pid[pid] = proc
        return proc

    def replace(self, proc: ProcessFacts, **changes) -> ProcessFacts:
        """The same process with some facts changed (a rename, a new thread, an exec): a new
        ProcessFacts, as the inventory makes one after every change."""
        fields = {f: getattr(proc, f) for f in ("pid", "start_time", "name", "exe", "cmdline", "cgroup",
                                                "cgroup_systemd", "unit", "is_kernel_thread", "ppid", "uid",
                                                "execs", "on_demand", "unreadable")}
        threads = changes.pop("threads", None)
        fields.update(changes)
        fields["threads"] = MappingProxyType(dict(threads if threads is not None else proc.threads))
        new = ProcessFacts(**fields)
        self.by_pid[new.pid] = new
        return new

    def rename_thread(self, proc: ProcessFacts, tid: int, comm: str) -> ProcessFacts:
        threads = dict(proc.threads)
        old = threads[tid]
        threads[tid] = thread(tid, comm, pid=old.pid, start_time=old.start_time, affinity=old.affinity,
                              policy=old.policy, nice=old.nice, runtime_ns=old.runtime_ns)
        return self.replace(proc, threads=threads, **({"name": comm} if tid == proc.pid else {}))

    def add_threads(self, proc: ProcessFacts, names: Iterable[str], first_tid: Optional[int] = None) -> ProcessFacts:
        threads = dict(proc.threads)
        tid = first_tid if first_tid is not None else max(threads) + 1
        for name in names:
            threads[tid] = thread(tid, name, pid=proc.pid, start_time=proc.start_time)
            tid += 1
        return self.replace(proc, threads=threads)

    def remove(self, proc: ProcessFacts) -> None:
        self.by_pid.pop(proc.pid, None)

    @property
    def processes(self) -> List[ProcessFacts]:
        return list(self.by_pid.values())

    def tids(self, proc: ProcessFacts, comm_prefix: str = "") -> Tuple[int, ...]:
        return tuple(sorted(t.tid for t in proc.threads.values() if t.comm.startswith(comm_prefix)))


__all__ = ["ALL_CPUS", "FactsHost", "process", "profile", "thread"]
