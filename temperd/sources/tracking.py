"""Which processes the inventory tracks, and how much of an untrusted owner's it keeps.

Tracked: a process the gate (decide/candidates.py) wants, one a runtime binding names, and any
descendant of a tracked process (a child may carry its creator's treatment: inheritance). The
rest are light records (sources/light.py).

An untrusted owner (decide/trust.py: not root, a system account, a system unit or [trust]) can
name its processes and threads like a profile's: a process with tens of thousands of threads so
named once kept temperd at a whole core and its memory grown for good. So an untrusted owner's
tracked processes and threads are bounded (OWNER_PROCESSES, OWNER_THREADS, PROCESS_THREADS):
beyond them a process stays light and a thread is not read (its events cost a lookup), with one
warning per owner until its tracked processes are all gone. Its events are handled after the
trusted ones of their batch.
"""

from __future__ import annotations

import logging
from typing import Any, Dict, Mapping, Optional, Set, Tuple, Union

from temperd.sources import procfs
from temperd.sources.facts import systemd_cgroup
from temperd.sources.light import EVERYTHING, Gate, Probe
from temperd.sources.process_store import ProcessRecord, ProcessStore

log = logging.getLogger("temperd.sources.inventory")

OWNER_PROCESSES = 16  # tracked processes of one untrusted owner
OWNER_THREADS = 2048  # tracked threads of one untrusted owner, all its processes together
PROCESS_THREADS = 512  # tracked threads of one untrusted process


class OwnerBounds:
    """An untrusted owner's tracked processes (pid -> uid, the untrusted only), and the room left."""

    def __init__(self) -> None:
        self.owner_of: Dict[int, int] = {}
        self._pids: Dict[int, Set[int]] = {}  # uid -> its tracked pids
        self._warned: Set[int] = set()
        self.refused = 0  # processes kept light and threads not read, for status

    def admit_process(self, uid: int, pid: int) -> bool:
        """Whether one more process of this untrusted owner may be tracked (counted if so)."""
        pids = self._pids.setdefault(uid, set())
        if len(pids) >= OWNER_PROCESSES and pid not in pids:
            self._refuse(uid, f"{OWNER_PROCESSES} processes")
            return False
        pids.add(pid)
        self.owner_of[pid] = uid
        return True

    def thread_room(self, pid: int, procs: Mapping[int, Any]) -> Optional[int]:
        """How many more threads the process pid may have tracked; None: not bounded (trusted)."""
        uid = self.owner_of.get(pid)
        if uid is None:
            return None
        proc = procs.get(pid)
        own = len(proc.threads) if proc is not None else 0
        everyone = sum(len(procs[p].threads) for p in self._pids.get(uid, ()) if p in procs)
        room = min(PROCESS_THREADS - own, OWNER_THREADS - everyone)
        if room <= 0:
            self._refuse(uid, f"{PROCESS_THREADS} threads per process or {OWNER_THREADS} in all")
        return max(0, room)

    def process_gone(self, pid: int) -> None:
        uid = self.owner_of.pop(pid, None)
        if uid is None:
            return
        pids = self._pids.get(uid)
        if pids is not None:
            pids.discard(pid)
            if not pids:  # the flood is gone: the owner starts afresh, warned again if it comes back
                del self._pids[uid]
                self._warned.discard(uid)

    def _refuse(self, uid: int, bound: str) -> None:
        self.refused += 1
        if uid not in self._warned:
            self._warned.add(uid)
            log.warning("uid %d is not trusted and reached the bound of %s tracked for it: its further "
                        "processes and threads are not read (nothing of theirs is raised anyway)", uid, bound)


LIGHT = "light"  # read_new: the process is kept light


class Tracker:
    """The inventory's choice, per process, between tracking it and keeping it light."""

    def __init__(self, store: ProcessStore):
        self.store = store
        self.gate: Gate = EVERYTHING
        self.bounds = OwnerBounds()
        store.removed = self.bounds.process_gone
        self.kept_light = 0  # programs looked at and turned down since start (an exec, a scan's look)

    @property
    def selective(self) -> bool:
        return self.gate is not EVERYTHING

    def admit(self, pid: int, stat: procfs.TaskStat, wanted: bool = False) -> Tuple[bool, Optional[int], Optional[Probe]]:
        """Whether to track pid, whose leader's stat was read, and at most how many of its threads
        (None: all), and the probe of what the gate read of it. One not tracked is kept as a light
        record. wanted: the gate said so already (a rename event's new name)."""
        store = self.store
        if not self.selective:
            return True, None, None
        # Nothing taken from the parent's record: an exec is where a process changes cgroup
        # (systemd moves its child into the unit's cgroup between fork and exec).
        probe = Probe(pid, stat)
        if procfs.is_kernel_thread(pid, stat) or not (wanted or stat.ppid in store.procs or self.gate.wants(probe)):
            self._keep_light(probe)
            return False, None, probe
        paths = probe.cgroup()
        uid = probe.uid
        if self.gate.trusted(uid, systemd_cgroup(paths.unified, paths.systemd) if paths else None):
            return True, None, probe
        if not self.bounds.admit_process(-1 if uid is None else uid, pid):
            self._keep_light(probe)
            return False, None, probe
        return True, self.bounds.thread_room(pid, store.procs), probe

    def _keep_light(self, probe: Probe) -> None:
        self.kept_light += 1
        record = probe.record()
        old = self.store.light.get(probe.pid)
        if old is None or not old.same(record):  # an unchanged one is left alone: no snapshot rebuilt for it
            self.store.put_light(record)

    def read_new(self, pid: int, stat: Optional[procfs.TaskStat] = None,
                 wanted: bool = False) -> Union[ProcessRecord, None, str]:
        """A process not tracked yet, read whole if admitted; LIGHT if kept light; None if gone."""
        if stat is None:
            stat = procfs.read_task_stat(pid, pid)
            if stat is None:
                return None
        track, limit, probe = self.admit(pid, stat, wanted)
        if not track:
            return LIGHT
        proc = self.store.read_process(pid, None, limit, probe, leader=stat)
        if proc is None:
            self.bounds.process_gone(pid)
        return proc

    def thread_room(self, pid: int) -> Optional[int]:
        return self.bounds.thread_room(pid, self.store.procs)
