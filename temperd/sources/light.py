"""Processes no profile can match, kept light: what the inventory knows of a process it does not track.

A new or exec'd process is first looked at through a `Probe`: its leader's stat (name, parent,
start time) and, lazily, whatever the gate (decide/candidates.py: the loaded profiles, bindings
and runtime bindings compiled once per reload) asks for — the executable, the cgroup, the command
line, the owner, a variable of the environment — in the order the gate asks, each read at most
once. A process the gate turns down is kept as a `LightRecord`: no thread of it is read, no
change is reported for it (no replan), and a fork of it is another light record made without a
read (a child that does not exec has its parent's program, cgroup and title; its exec is looked at
afresh, and a scan sees a move or a new title). A process is
tracked (read whole, its threads kept current) when the gate wants it, when it descends from a
tracked process (its threads may carry a treated creator's settings: inheritance), or when a
runtime binding names it.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import FrozenSet, Optional, Tuple

from temperd.sources import procfs
from temperd.sources.facts import ProcessFacts, ThreadFacts, system_unit_of, systemd_cgroup

_UNREAD = object()


class Probe:
    """One process's facts, each read from /proc the first time the gate asks (None: gone or denied)."""

    __slots__ = ("pid", "stat", "start_time", "ppid", "comm", "_exe", "_cgroup", "_cmdline", "_uid", "reads")

    def __init__(self, pid: int, stat: procfs.TaskStat):
        self.pid = pid
        self.stat = stat
        self.start_time = stat.start_time
        self.ppid = stat.ppid
        self.comm = stat.comm
        self._exe = self._cmdline = self._uid = self._cgroup = _UNREAD
        self.reads = 1  # the stat

    def exe(self) -> Optional[str]:
        if self._exe is _UNREAD:
            self.reads += 1
            self._exe = procfs.read_exe(self.pid)
        return self._exe  # type: ignore[return-value]

    def cgroup(self) -> Optional[procfs.CgroupPaths]:
        if self._cgroup is _UNREAD:
            self.reads += 1
            self._cgroup = procfs.read_cgroup(self.pid)
        return self._cgroup  # type: ignore[return-value]

    def cmdline(self) -> Tuple[str, ...]:
        if self._cmdline is _UNREAD:
            self.reads += 1
            self._cmdline = procfs.read_cmdline(self.pid) or ()
        return self._cmdline  # type: ignore[return-value]

    @property
    def uid(self) -> Optional[int]:
        if self._uid is _UNREAD:
            self.reads += 1
            self._uid = procfs.read_uid(self.pid)
        return self._uid  # type: ignore[return-value]

    @property
    def system_unit(self) -> Optional[str]:
        """As ProcessFacts.system_unit: what trust reads (with uid)."""
        paths = self.cgroup()
        return system_unit_of(systemd_cgroup(paths.unified, paths.systemd)) if paths is not None else None

    def environ(self, name: str) -> Optional[str]:
        self.reads += 1
        return procfs.read_environ_var(self.pid, name)

    def found(self, fact: str):
        """A fact ("exe", "cgroup", "cmdline", "uid") the gate read and found; None where it read
        none (or found none: then it is read again, strictly, by whoever needs to tell why)."""
        value = getattr(self, "_" + fact)
        return None if value is _UNREAD or value == () else value

    def record(self) -> "LightRecord":
        known = lambda value: None if value is _UNREAD else value  # noqa: E731
        return LightRecord(self.pid, self.stat, self.ppid, self.comm, known(self._exe),
                           known(self._cgroup), known(self._cmdline))


class LightRecord:
    """An untracked process: who it is and what the gate read of it."""

    __slots__ = ("pid", "stat", "ppid", "comm", "exe", "cgroup", "cmdline", "_frozen")

    def __init__(self, pid: int, stat: Optional[procfs.TaskStat], ppid: int, comm: str, exe: Optional[str],
                 cgroup: Optional[procfs.CgroupPaths], cmdline: Optional[Tuple[str, ...]]):
        self.pid = pid
        self.stat = stat  # the leader's when last read; None: a fork not read yet (its exec or the next scan reads it)
        self._frozen: Optional[ProcessFacts] = None
        self.ppid = ppid
        self.comm = comm
        self.exe = exe
        self.cgroup = cgroup
        self.cmdline = cmdline

    @property
    def start_time(self) -> Optional[int]:
        return self.stat.start_time if self.stat is not None else None

    def forked(self, pid: int) -> "LightRecord":
        """A child forked from this process: the same program, cgroup and title, no read."""
        return LightRecord(pid, None, self.pid, self.comm, self.exe, self.cgroup, self.cmdline)

    def same(self, other: "LightRecord") -> bool:
        """Whether another reading shows the same process as this one (its leader's counters aside)."""
        return (self.start_time, self.ppid, self.comm, self.exe, self.cgroup, self.cmdline) == \
            (other.start_time, other.ppid, other.comm, other.exe, other.cgroup, other.cmdline)

    def renamed(self, comm: str) -> "LightRecord":
        return LightRecord(self.pid, self.stat, self.ppid, comm, self.exe, self.cgroup, self.cmdline)

    def freeze(self) -> Optional[ProcessFacts]:
        """Its facts for the snapshot: marked light (the matcher passes them by), with its leader as
        last read (its affinity not read: empty) and no other thread; None before its first read."""
        stat = self.stat
        if stat is None:
            return None
        if self._frozen is None:
            kernel = procfs.is_kernel_thread(self.pid, stat)
            leader = ThreadFacts(tid=self.pid, pid=self.pid, start_time=stat.start_time, comm=self.comm,
                                 affinity=frozenset(), policy=stat.policy, nice=stat.nice, last_cpu=stat.last_cpu,
                                 is_kernel_thread=kernel)
            paths = self.cgroup
            self._frozen = ProcessFacts(
                pid=self.pid, start_time=stat.start_time, name=self.comm, exe=self.exe, cmdline=self.cmdline or (),
                cgroup=paths.unified if paths else None, cgroup_systemd=paths.systemd if paths else None,
                unit=paths.unit if paths else None, is_kernel_thread=kernel, ppid=self.ppid,
                threads=MappingProxyType({self.pid: leader}), light=True)
        return self._frozen


class Gate:
    """Which processes are worth tracking. This one wants every process (as before any index is
    loaded: tests, tools); decide/candidates.py's CandidateIndex wants only possible matches."""

    bound: FrozenSet[int] = frozenset()  # pids that runtime bindings name
    describe = "every process (no candidate index)"

    def wants(self, probe: Probe) -> Optional[str]:
        """Why this process could match (what the gate read for it is cached on the probe); None: it cannot."""
        return "no candidate index"

    def wants_name(self, comm: str) -> bool:
        """Whether a process named so could match by its name alone (a rename of a light process)."""
        return True

    def trusted(self, uid: Optional[int], unit_cgroup: Optional[str]) -> bool:
        """Whether processes of this owner (and unit) are trusted: their work goes first and is not bounded."""
        return True


EVERYTHING = Gate()
