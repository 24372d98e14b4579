"""Treatment a thread inherited from its creator, and the way back from it.

A new thread starts with its creator's affinity, policy, nice and slice, and a forked process's
first thread with those of the thread that forked it. When temperd had treated the creator, the
new thread carries temperd's treatment, whatever layer it belongs to. The rules:

- the creator is a thread of the same process, else of the parent process, on which temperd
  had written the very value the new thread has now (`uninherited`);
- the new thread's original of such a setting is the creator's original, and the inherited
  value counts as written by temperd: the thread gets the creator's original back where no
  layer wants that setting for it, when it leaves its layer, and at stop;
- stop and recovery restore the creators first, then sweep the creators' processes and their
  descendants for threads made in the meantime (or while no temperd ran) that inherited
  temperd's treatment, and restore those, until a sweep finds none while no creator may still be
  inside a fork it began before its restore (`restore_inherited`);
- a value temperd has since replaced or given back on the creator still counts for a while, for
  threads made while the creator carried it (given_back.py).
"""

from __future__ import annotations

import time
from bisect import bisect_right
from operator import attrgetter
from typing import Any, Callable, Container, Dict, FrozenSet, Iterable, List, Mapping, Optional, Set, Tuple

from temperd.backends.native import sched
from temperd.backends.native.given_back import GivenBack
from temperd.backends.native.membership import ThreadKey, scan_threads
from temperd.backends.native.restore_ledger import RestoreLedger
from temperd.backends.native.thread_settings import THREAD_KINDS, ThreadRecord, as_read, reported, thread_values
from temperd.backends.result import ApplyResult
from temperd.sources import procfs

MAX_SWEEPS = 20  # sweeps for threads that inherited temperd's treatment, at stop and at recovery
UNSURE_SWEEPS = 3  # more sweeps while a creator is runnable (it may be inside a fork)
FORK_SETTLE_S = 0.005  # the pause before a sweep that waits for a fork under way

ParentOf = Callable[[int], Optional[int]]
_BY_TID = attrgetter("tid")


class Parents:
    """The parent process of a process, read from /proc once per pid (one pass: pids get reused)."""

    def __init__(self) -> None:
        self._known: Dict[int, Optional[int]] = {}

    def __call__(self, pid: int) -> Optional[int]:
        if pid not in self._known:
            stat = procfs.read_thread_stat(pid)
            self._known[pid] = stat.ppid if stat else None
        return self._known[pid]


class _InOrder:
    """The records that wrote one value, leader first, then by tid (with their order, to insert by)."""

    __slots__ = ("orders", "records")

    def __init__(self) -> None:
        self.orders: List[Tuple[bool, int]] = []
        self.records: List[ThreadRecord] = []

    def append(self, rec: ThreadRecord) -> None:
        """A record that comes after every one held (an index built in order)."""
        self.orders.append(_creator_order(rec))
        self.records.append(rec)

    def insert(self, rec: ThreadRecord) -> None:
        """A record in its place, after those of its own order."""
        order = _creator_order(rec)
        at = bisect_right(self.orders, order)
        self.orders.insert(at, order)
        self.records.insert(at, rec)


Index = Dict[str, Dict[Any, _InOrder]]  # a process's: kind -> the value written, as reported -> its records


class Creators:
    """The threads that may have created a new one, found by value: each process's held threads
    indexed by what temperd wrote of each kind, leader first, then by tid. Used for a pass over
    new threads (a fork storm in a process with hundreds of treated threads then costs a lookup
    per new thread, not a pass over them all); `add` a record made during the pass. One kept
    across passes is brought up to the ledger at each (`follow`): only the records changed since
    are indexed again. An entry whose record since forgot or changed the value stays until its
    process is indexed afresh: `find` checks each candidate against its record."""

    def __init__(self, ledger: RestoreLedger, online: FrozenSet[int], given_back: Optional[GivenBack] = None):
        self.ledger = ledger
        self.online = online
        self.given_back = given_back
        self._index: Dict[int, Index] = {}
        self._pid_of: Dict[ThreadKey, int] = {}  # an indexed record's process, for when it is forgotten
        self._budget: Dict[int, int] = {}  # per process: the changes left before its index is built afresh

    def follow(self, online: FrozenSet[int]) -> None:
        """For another pass: index again the records the ledger changed since the last (an
        affinity's key is within the online CPUs: where those changed, the index starts afresh)."""
        changed = self.ledger.follow()
        if online != self.online:
            self.online = online
            self._index.clear()
            self._pid_of.clear()
            self._budget.clear()
            return
        for key in changed:
            rec = self.ledger.records.get(key)
            if rec is not None:
                self.add(rec)
                continue
            pid = self._pid_of.pop(key, None)
            if pid in self._index and (not self.ledger.holds_pid(pid) or not self._spend(pid)):
                self._drop(pid)

    def _spend(self, pid: int) -> bool:
        """One change to a process's index; False where its stale entries may outnumber its live ones."""
        self._budget[pid] -= 1
        return self._budget[pid] > 0

    def _drop(self, pid: int) -> None:
        """A process's index let go: built again from the ledger when next asked."""
        del self._index[pid]
        del self._budget[pid]

    def add(self, rec: ThreadRecord) -> None:
        """A record made during the pass (or changed since the last), in its place (its process's
        index, where one is built, would hold it had it been built now). Only what it holds
        already counts: what the pass intends for it is unwritten until the pass's writes, and
        `find` passes over it."""
        index = self._index.get(rec.pid)
        if index is None:
            return  # built from the ledger, this record included, when first asked
        if not self._spend(rec.pid):
            self._drop(rec.pid)
            return
        self._pid_of[rec.key] = rec.pid
        for kind, value in rec.written.items():
            index.setdefault(kind, {}).setdefault(reported(kind, value, self.online), _InOrder()).insert(rec)

    def find(self, pid: int, thread: Any, kind: str, current: Any,
             unwritten: Mapping[ThreadKey, Container[str]]) -> Optional[Tuple[Any, Any]]:
        """(the creator's original, the value temperd had written) for the first thread of `pid`
        that carried temperd's `current` value of `kind` when `thread` started: one that carries
        it now, else one temperd has since given it back on (given_back.py)."""
        index = self._index.get(pid)
        if index is None:
            index = self._build(pid) if self.ledger.holds_pid(pid) else {}
        by_value = index.get(kind)
        if not by_value and not (self.given_back and self.given_back.holds(pid)):
            return None  # nothing of this kind was written in the process: a new thread's usual case
        key = as_read(kind, current)
        same = (by_value or {}).get(key)
        for cand in (same.records if same is not None else ()):
            if (cand.tid != thread.tid and (cand.since or cand.start_time) <= thread.start_time
                    and self.ledger.records.get(cand.key) is cand and kind in cand.written
                    and kind not in unwritten.get(cand.key, ())
                    and reported(kind, cand.written[kind], self.online) == key):
                return cand.originals[kind], cand.written[kind]
        earlier = self.given_back.find(pid, kind, key, thread.start_time, self.online) if self.given_back else None
        return (earlier.original, earlier.written) if earlier is not None else None

    def _build(self, pid: int) -> Index:
        """The process's index from the ledger, kept where it holds threads of the process."""
        index: Index = {}
        records = self.ledger.by_pid(pid)
        for rec in _in_creator_order(records):
            self._pid_of[rec.key] = pid
            for kind, value in rec.written.items():
                index.setdefault(kind, {}).setdefault(reported(kind, value, self.online), _InOrder()).append(rec)
        if records:
            self._index[pid] = index
            self._budget[pid] = 2 * len(records) + 64
        return index


def _creator_order(rec: ThreadRecord) -> Tuple[bool, int]:
    """The leader first (the usual creator), then by tid."""
    return rec.tid != rec.pid, rec.tid


def _in_creator_order(records: List[ThreadRecord]) -> List[ThreadRecord]:
    """sorted(records, key=_creator_order), sorted by tid in C (a process of a fork storm holds
    hundreds, and its index is built at each pass)."""
    ordered = sorted(records, key=_BY_TID)
    leaders = [rec for rec in ordered if rec.tid == rec.pid]
    return leaders + [rec for rec in ordered if rec.tid != rec.pid] if leaders else ordered


def uninherited(creators: Creators, thread: Any, current: Dict[str, Any], online: FrozenSet[int],
                parent_of: ParentOf, unwritten: Optional[Mapping[ThreadKey, Container[str]]] = None
                ) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """A new thread or process starts with its creator's settings, which may be temperd's treatment:
    where a setting equals what temperd wrote on a thread of the same process (else of the parent
    process), the creator's original is the new thread's original.

    Returns the originals and the settings inherited from temperd's treatment (kind -> the value
    temperd wrote on the creator), which the caller records as written by temperd. `unwritten`:
    the settings of records that are intents not yet carried out (nobody inherited those).
    `creators`: the index of one pass over new threads."""
    unwritten = unwritten if unwritten is not None else {}
    ppid: Optional[int] = None
    originals: Dict[str, Any] = {}
    inherited: Dict[str, Any] = {}
    for kind in THREAD_KINDS:
        found = creators.find(thread.pid, thread, kind, current[kind], unwritten)
        if found is None:
            if ppid is None:
                ppid = parent_of(thread.pid) or 0
            found = creators.find(ppid, thread, kind, current[kind], unwritten) if ppid else None
        # A value that is the creator's original itself has nothing to give back.
        if found is not None and as_read(kind, current[kind]) != reported(kind, found[0], online):
            originals[kind], inherited[kind] = found
    return originals, inherited


def family(roots: Iterable[int]) -> List[int]:
    """The live user-space processes among `roots` and all their descendants, parents before children."""
    children: Dict[int, List[int]] = {}
    alive: Set[int] = set()
    for pid in procfs.list_pids():
        stat = procfs.read_thread_stat(pid)
        if stat is None or stat.state in ("Z", "X", "x") or procfs.is_kernel_thread(pid, stat):
            continue
        alive.add(pid)
        children.setdefault(stat.ppid, []).append(pid)
    order = [pid for pid in sorted(set(roots)) if pid in alive]
    seen = set(order)
    i = 0
    while i < len(order):
        for child in sorted(children.get(order[i], ())):
            if child not in seen:
                seen.add(child)
                order.append(child)
        i += 1
    return order


def restore_inherited(ledger: RestoreLedger, creators: RestoreLedger,
                      given_back: Optional[GivenBack] = None) -> ApplyResult:
    """After the creators were restored: give back the creators' originals to threads that
    inherited temperd's treatment and that `ledger` does not hold (made after the last pass over
    new threads, or while no temperd ran). `creators` is a copy of the ledger from before its
    restore (what temperd had written, on whom); each thread found is recorded in `ledger`, added
    to `creators` (its own new threads inherited the same) and restored. Sweeps the creators'
    processes and their descendants until a sweep finds no such thread, at most MAX_SWEEPS times.
    `given_back`: values temperd gave back on threads before (a thread made before that may still
    carry one)."""
    out = ApplyResult()
    if not creators.records and not (given_back and given_back.pids()):
        return out
    online = ledger.now_online()
    looked_at: Set[ThreadKey] = set(creators.records)  # a thread inherits once, at creation
    unsure = UNSURE_SWEEPS
    for _ in range(MAX_SWEEPS):
        found = 0
        parents = Parents()
        for pid in family(creators.pids() | (given_back.pids() if given_back else set())):
            for thread in scan_threads([pid]):
                key = (thread.tid, thread.start_time)
                if key in looked_at or ledger.get(*key) is not None:
                    continue
                looked_at.add(key)
                try:
                    affinity, state = sched.get_affinity(thread.tid), sched.get_sched(thread.tid)
                except OSError as exc:
                    if not sched.is_gone(exc):
                        raise
                    continue
                originals, inherited = uninherited(Creators(creators, online, given_back), thread,
                                                   thread_values(affinity, state), online, parents)
                if not inherited:
                    continue
                found += 1
                rec = ledger.record(thread.tid, thread.pid, thread.start_time, thread.comm, since=thread.start_time)
                rec.originals.update(originals)
                rec.written.update(inherited)
                creators.add(rec.copy())
                out.merge(ledger.restore(rec, online=online))
        if found:
            continue
        # A sweep that finds none is the last only when no thread that carried temperd's
        # treatment may still be inside a fork begun before its restore: the child, not in /proc
        # yet, copies what the creator had then. One blocked in fork is waited for; one that is
        # runnable (preempted, perhaps mid-fork) gets a few more sweeps.
        forking = _forking(creators)
        if forking == procfs.RUNNING:
            if not unsure:
                break
            unsure -= 1
        elif forking is None:
            break
        time.sleep(FORK_SETTLE_S)
    return out


def _forking(creators: RestoreLedger):
    """Whether a thread of `creators` is blocked in a fork (its syscall number), else runnable
    (procfs.RUNNING), else None."""
    runnable = None
    for tid, pid in {(rec.tid, rec.pid) for rec in creators.records.values()}:
        doing = procfs.task_syscall(pid, tid)
        if doing in procfs.FORK_SYSCALLS:
            return doing
        if doing == procfs.RUNNING:
            runnable = doing
    return runnable
