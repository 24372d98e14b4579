"""What the sources know about each process and thread: the typed facts every later stage reads.

The inventory builds them from /proc and process events; the matcher, the planner, the backends
and the observer read them, never /proc directly for these fields. What only some decisions need
(an environment variable, a cgroup's quota) is read on demand, once per program image.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Dict, FrozenSet, Mapping, Optional, Tuple


class OnDemand:
    """The facts of one program image that only some decisions need, read the first time one
    asks: a variable of its environment (an environment binding; kept), and its cgroup's CPU
    quota (a workload's budget; kept per cgroup by the inventory's store, which a scan clears: an
    operator may change it). The inventory makes one per (pid, start time, exec count), so an
    exec reads the new environment."""

    __slots__ = ("_read_environ", "_read_quota", "_environ")

    def __init__(self, read_environ: Callable[[str], Optional[str]],
                 read_quota: Callable[[str], Optional[float]]):
        self._read_environ = read_environ
        self._read_quota = read_quota
        self._environ: Dict[str, Optional[str]] = {}

    @classmethod
    def known(cls, environ: Optional[Mapping[str, str]] = None,
              quotas: Optional[Mapping[str, float]] = None) -> "OnDemand":
        """Facts given, not read (tests, and callers that already know them)."""
        environ, quotas = dict(environ or {}), dict(quotas or {})
        return cls(environ.get, quotas.get)

    def environ(self, name: str) -> Optional[str]:
        if name not in self._environ:
            self._environ[name] = self._read_environ(name)
        return self._environ[name]

    def cpu_quota(self, cgroup: str) -> Optional[float]:
        return self._read_quota(cgroup)


_NOTHING = OnDemand.known()

# Unit suffixes a process can live in (slices only contain units; they hold no processes).
UNIT_SUFFIXES = (".service", ".scope", ".socket", ".mount", ".swap")
USER_SLICE = "user.slice"  # logind's sessions and each user's own manager (user@UID.service)
_USER_MANAGER = re.compile(r"user@\d+\.service")  # a manager of units of its own


def systemd_cgroup(unified: Optional[str], named: Optional[str]) -> Optional[str]:
    """The path of the hierarchy systemd keeps its units in: the name=systemd one where the host
    has it (legacy and hybrid layouts, whose v2 path may be "/" whatever the unit), else the v2
    path. The unit, its slice and whether it is a system unit are all read from this one path."""
    return named if named is not None else unified


def unit_from_cgroup(path: Optional[str]) -> Optional[str]:
    """The systemd unit a cgroup path belongs to: its first component naming a unit, the one the
    manager made. /system.slice/memcached.service -> memcached.service; a delegated subtree such
    as /system.slice/app.service/worker still belongs to app.service, whatever its owner names
    the directories below (a container's /system.slice/memcached.service inside
    docker-1.scope is docker-1.scope's). Below a user's own manager (user@UID.service) the unit
    is the first one that manager made: user@1000.service/app.slice/foo.service -> foo.service.
    """
    if not path:
        return None
    unit = None
    for part in path.split("/"):
        if part.endswith(UNIT_SUFFIXES):
            unit = part
            if not _USER_MANAGER.fullmatch(part):
                return part
    return unit


def system_unit_of(path: Optional[str]) -> Optional[str]:
    """The unit of a systemd cgroup path when the system manager runs it; None for no unit, a
    login session or a user's own service (everything under user.slice, any user@UID.service)."""
    unit = unit_from_cgroup(path)
    if unit is None:
        return None
    parts = (path or "").split("/")
    if USER_SLICE in parts or any(p.startswith("user@") and p.endswith(".service") for p in parts):
        return None
    if unit.startswith("session-") and unit.endswith(".scope"):
        return None
    return unit


@dataclass(frozen=True)
class ThreadFacts:
    tid: int
    pid: int  # the thread group (process) id
    start_time: int  # clock ticks after boot; (tid, start_time) identifies the thread
    comm: str  # the thread name (pthread_setname_np / PR_SET_NAME), at most 15 bytes
    affinity: FrozenSet[int]  # empty: not read (the leader of an untracked process)
    policy: int  # SCHED_OTHER 0, FIFO 1, RR 2, BATCH 3, IDLE 5, DEADLINE 6
    nice: int
    last_cpu: int
    is_kernel_thread: bool  # kernel threads are never treated
    runtime_ns: Optional[int] = None  # time on CPU, only as of the last refresh_runtime()


@dataclass(frozen=True)
class ProcessFacts:
    pid: int
    start_time: int
    name: str  # comm of the leader thread
    exe: Optional[str]  # None: kernel thread, zombie leader, or not permitted
    cmdline: Tuple[str, ...]  # a rewritten process title comes as one argument
    cgroup: Optional[str]  # cgroup v2 path (the "0::" line)
    cgroup_systemd: Optional[str]  # name=systemd path on hybrid hosts
    unit: Optional[str]  # the systemd unit (systemd_cgroup's): memcached.service, session-2.scope
    is_kernel_thread: bool
    ppid: int
    threads: Mapping[int, ThreadFacts]
    uid: Optional[int] = None  # the real uid, None where unreadable; what trust is decided on
    # Execs seen since the inventory first saw this process: with (pid, start_time) it names one
    # program image, so whatever was read from the environment is read again after an exec.
    execs: int = 0
    on_demand: OnDemand = field(default=_NOTHING, compare=False, repr=False)
    # Facts the kernel denied (exe, cmdline, uid): the process is there, these are not ours to
    # read — unlike a None of a process that is gone.
    unreadable: Tuple[str, ...] = ()
    # Not tracked (sources/light.py): no profile, binding or marker can match it; only its leader
    # is known, as last read, and the matcher passes it by.
    light: bool = False

    def environ(self, name: str) -> Optional[str]:
        """A variable of the process environment (read once per program image), None if unset
        or unreadable."""
        return self.on_demand.environ(name)

    def cpu_quota(self) -> Optional[float]:
        """The CPU budget its cgroup's quota allows, in CPUs; None when unlimited or unknown."""
        return self.on_demand.cpu_quota(self.cgroup) if self.cgroup else None

    @property
    def unit_cgroup(self) -> Optional[str]:
        """The cgroup path `unit` comes from (systemd_cgroup)."""
        return systemd_cgroup(self.cgroup, self.cgroup_systemd)

    @property
    def system_unit(self) -> Optional[str]:
        """The unit when the system manager runs it (only root starts those); None otherwise."""
        return system_unit_of(self.unit_cgroup)

    @property
    def title(self) -> str:
        """The command line as `ps` shows it; for PostgreSQL backends the process title."""
        return " ".join(self.cmdline)
