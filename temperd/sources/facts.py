"""What the sources know about each process and thread: the typed facts every later stage reads.

The inventory builds them from /proc and process events; the matcher, the planner, the backends
and the observer read them, never /proc directly for these fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import FrozenSet, Mapping, Optional, Tuple


@dataclass(frozen=True)
class ThreadFacts:
    tid: int
    pid: int  # the thread group (process) id
    start_time: int  # clock ticks after boot; (tid, start_time) identifies the thread
    comm: str  # the thread name (pthread_setname_np / PR_SET_NAME), at most 15 bytes
    affinity: FrozenSet[int]
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
    unit: Optional[str]  # the systemd unit of the cgroup: memcached.service, session-2.scope
    is_kernel_thread: bool
    ppid: int
    threads: Mapping[int, ThreadFacts]
    uid: Optional[int] = None  # the real uid, None where unreadable; what trust is decided on
    # Execs seen since the inventory first saw this process: with (pid, start_time) it names one
    # program image, so whatever was read from the environment is read again after an exec.
    execs: int = 0

    @property
    def title(self) -> str:
        """The command line as `ps` shows it; for PostgreSQL backends the process title."""
        return " ".join(self.cmdline)

    @property
    def leader(self) -> Optional[ThreadFacts]:
        return self.threads.get(self.pid)
