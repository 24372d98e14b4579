"""Yield threads that share a session with others, moved into an idle cpu cgroup (cgroup v1).

With autogroups (autogroup.py), a session that holds yield threads beside untreated or favoured
ones keeps its group entity's full weight: its SCHED_IDLE and SCHED_BATCH threads yield only to
their session's peers, and the session still takes an even share of the host whenever its yield
threads are runnable. Measured on a 6.18 kernel with 2 CPUs: 4 SCHED_IDLE spinners in one session
held a 2-thread job of another session to 1.0 CPU; the same spinners in a cgroup with cpu.idle = 1
left it 1.98.

Where the cpu controller is bound to a cgroup v1 hierarchy, a cgroup takes single threads, and a
thread outside that hierarchy's root is out of autogroup's reach. So each such yield thread that
sits in the root cpu cgroup moves into temperd's own cgroup there, whose cpu.idle = 1 gives the
group entity itself idle weight: it runs where nothing else wants the CPU, and any waking thread
of another group preempts it. Threads in any other cpu cgroup stay: a cgroup someone made
arbitrates them already. Under cgroup v2 a thread leaves its process's cgroup only inside a
threaded subtree, so there it is not done, and the session's note says so.

A thread's cpu cgroup is a held setting (held.py), keyed by tid and start time: the original
("/") recorded before the move, a thread someone else moved elsewhere is theirs (drift), restore
moves it back. Threads created by a moved thread inherit its cgroup; they are held as if temperd
had moved them, so they go back too when they should not be there. restore_all() then moves
whatever is left in the cgroup to the root and removes it; the cgroup found at start is what a
killed predecessor left, and is emptied the same way.

So the state file names none of these threads: every original is the root, and the next start
empties the cgroup whatever the file says. A move is not preceded by a state-file write (a fork
storm moves hundreds of threads a second, and each write serialised the whole section).
"""

from __future__ import annotations

import hashlib
import os
from typing import Any, Callable, Container, Dict, Iterable, List, Optional, Sequence, Set, Tuple

from temperd.sources.mounts import cgroup1_cpu_mount
from temperd.backends.native.cgroup_moves import DeferredMoves
from temperd.backends.native.held import HeldSettings
from temperd.backends.native.membership import ThreadKey
from temperd.backends.native.thread_cgroup import IDLE_CGROUP, ROOT, ThreadCpuCgroup, move
from temperd.backends.result import ApplyResult
from temperd.sources import procfs

NAME = "temperd-yield"


def cgroup_name(state_dir: str, default_state_dir: str) -> str:
    """The cgroup belongs to one state file: a second temperd (a test's, a benchmark's, with its
    own state directory) must not empty the first one's."""
    if os.path.normpath(state_dir) == os.path.normpath(default_state_dir):
        return NAME
    return f"{NAME}-{hashlib.sha1(os.path.abspath(state_dir).encode()).hexdigest()[:8]}"


def detect() -> Tuple[Optional[str], str]:
    """(the cgroup v1 cpu hierarchy's mount, or None; why not)."""
    mount = cgroup1_cpu_mount()
    if mount is None:
        return None, ("the cpu controller is not on a cgroup v1 hierarchy (under cgroup v2 a thread leaves its "
                      "process's cgroup only inside a threaded subtree)")
    if not os.path.exists(os.path.join(mount, "cpu.idle")):
        return None, f"{mount} has no cpu.idle (a kernel before 5.15)"
    return mount, ""


class IdleCgroup(HeldSettings[ThreadKey, str]):
    """Holds yield threads of mixed sessions in temperd's idle cpu cgroup."""

    def __init__(self, name: str = NAME, mount: Optional[str] = None, why_not: str = ""):
        if mount is None and not why_not:
            mount, why_not = detect()
        self.mount = mount
        self.why_not = why_not  # empty where supported
        self.path = "/" + name  # the cgroup, as /proc/TID/cgroup names it
        self._moves: DeferredMoves[ThreadKey, str] = DeferredMoves()  # add()'s moves into the cgroup
        # The processes with threads held here, and those add() held threads of since the last
        # apply(): a superset is enough (it only says whose other new threads' cgroup add() reads),
        # and it spares add() a walk over every held thread. apply() makes it again.
        self._pids: Optional[Set[int]] = None
        self._made = False  # the cgroup was made (or found) with cpu.idle = 1; see _ensure()
        super().__init__(ThreadCpuCgroup(mount or ""))

    @property
    def supported(self) -> bool:
        return not self.why_not

    def state(self) -> Dict[str, Any]:
        """Nothing for the state file (see above): a start empties the cgroup."""
        return {}

    def apply(self, threads: Iterable, verify: bool = True, fresh: Container[ThreadKey] = ()) -> ApplyResult:
        """Hold these threads (with tid, start_time) in the idle cgroup, where they sit in the
        hierarchy's root or in it already; everything else temperd holds there goes back.
        verify False (between whole applies): a thread temperd already holds there is not read
        again (each costs two /proc reads, and a fork storm's batches come ten a second).
        fresh: the keys of threads the inventory read in this pass (their start time is not read again)."""
        result = self.settle()
        self._pids = None
        self._made = False
        if not self.supported:
            return result
        threads = list(threads)
        if threads and not self._ensure(result):
            return result
        with self.setting.batch(fresh):
            self.setting.open_tasks(self.path)
            result.merge(self._apply(threads, verify))
        return result

    def _apply(self, threads: List, verify: bool) -> ApplyResult:
        desired = {}
        trusted = set()
        read = {}
        for thread in threads:
            key = (thread.tid, thread.start_time)
            if not verify and self.written.get(key) == self.path and key not in self.drifted:
                desired[key] = self.path
                trusted.add(key)
                continue
            self._want(key, desired, read)
        for key in self._inherited_strays(desired):
            self._as_moved(key)
        return self.hold(desired, None, trusted, read)

    def add(self, yielding: Iterable, others: Iterable, pid_of: Callable[[ThreadKey], Optional[int]],
            fresh: Container[ThreadKey] = ()) -> ApplyResult:
        """Between whole applies, where a batch left every session's mix as it was: `yielding`,
        new yield threads of mixed sessions, held here as apply() would hold them; of `others`
        (the batch's other threads), one held here goes back, and one of a process with
        threads held here that inherited the cgroup from its creator goes back too (pid_of: the
        process of a held thread, where known). What else is held is neither read nor written.
        The moves into the cgroup are made on a worker thread (cgroup_moves.py); what they did is
        told by the next call's result."""
        result = self.settle()
        yielding = list(yielding)
        if not self.supported or (yielding and not self._ensure(result)):
            return result
        if self._pids is None:
            self._pids = {pid for pid in map(pid_of, self.written) if pid is not None}
        self._pids.update(thread.pid for thread in yielding)
        with self.setting.batch(fresh):
            if yielding and not self.setting.open_tasks(self.path):
                self._made = False  # removed by someone else: made again
                if not self._ensure(result):
                    return result
                self.setting.open_tasks(self.path)
            desired, read = {}, {}
            for thread in yielding:
                key = (thread.tid, thread.start_time)
                if self.written.get(key) == self.path and key not in self.drifted:
                    continue
                self._want(key, desired, read)
            leaving = []
            for thread in others:
                key = (thread.tid, thread.start_time)
                if key in self.written:
                    leaving.append(key)
                elif thread.pid in self._pids and self._read_quietly(key) == self.path:
                    self._as_moved(key)
                    leaving.append(key)
            self.restore_keys(leaving, result)
            tasks = self.setting.take_tasks(self.path)
            if tasks is None:  # each move opens the file, and says why it cannot
                self._hold_more(desired, result, None, read)
            else:
                self._moves.submit(tasks, self.intend(desired, result, read))
        return result

    def settle(self, result: Optional[ApplyResult] = None) -> ApplyResult:
        """Wait for the moves add() handed to the worker thread: each that failed goes back as a
        write made here would have (HeldSettings.not_written). Counted into `result`, else a new one."""
        result = ApplyResult() if result is None else result
        made, failed = self._moves.wait()
        result.bump(result.applied, self.kind, made)
        for key, value, previous, exc in failed:
            self.not_written([(key, value, previous)], exc, result)
        return result

    def restore_keys(self, keys: Sequence[ThreadKey], result: ApplyResult) -> None:
        self.settle(result)  # a thread is not read while its move is on its way
        super().restore_keys(keys, result)

    def restore_all(self) -> ApplyResult:
        self._pids = None
        result = self.settle()
        result.merge(super().restore_all())
        self._moves.close()
        if self.supported:
            result.bump(result.restored, self.kind, self.empty())
        return result

    def empty(self) -> int:
        """Move every thread left in the cgroup to the root and remove it; how many were moved."""
        self.settle()  # nothing on its way while the cgroup is emptied
        moved = 0
        for tid in self._members():
            try:
                move(self.mount or "", ROOT, tid)
                moved += 1
            except OSError:
                pass  # gone meanwhile
        self._made = False
        try:
            os.rmdir(self._dir())
        except OSError:
            pass  # absent, or a thread created this instant: the next start empties it
        return moved

    # ---- steps ---------------------------------------------------------------------------------

    def _dir(self) -> str:
        return os.path.join(self.mount or "", self.path.lstrip("/"))

    def _ensure(self, result: ApplyResult) -> bool:
        """Make the cgroup (cpu.idle = 1) where it is not; False, with the reason kept, where it
        cannot be. Once made, only a whole apply makes sure of it again, or a batch whose open of
        its tasks file fails (events come ten or more batches a second)."""
        if self._made:
            return True
        try:
            os.makedirs(self._dir(), exist_ok=True)
            with open(os.path.join(self._dir(), "cpu.idle"), "w") as handle:
                handle.write("1")
        except OSError as exc:
            self.why_not = f"cannot make the idle cgroup {self._dir()}: {exc.strerror or exc}"
            self._fail(result, self.why_not)
            return False
        self._made = True
        return True

    def _want(self, key: ThreadKey, desired: Dict[ThreadKey, str], read: Dict[ThreadKey, Optional[str]]) -> None:
        """Read a thread's cgroup (kept in `read`); want it here where it sits in the root or here
        already, and hold it as moved where it is here (inherited from a thread temperd moved)."""
        read[key] = current = self._read_quietly(key)
        if current == self.path:
            self._as_moved(key)
        if current in (ROOT, self.path):
            desired[key] = self.path

    def _as_moved(self, key: ThreadKey) -> None:
        """Hold a thread found in the cgroup as if temperd had moved it there from the root."""
        self.originals.setdefault(key, ROOT)
        self.written.setdefault(key, self.path)

    def _members(self) -> List[int]:
        try:
            with open(os.path.join(self._dir(), "tasks")) as handle:
                return [int(x) for x in handle.read().split()]
        except OSError:
            return []

    def _inherited_strays(self, desired) -> List[ThreadKey]:
        """Threads in the cgroup that temperd does not hold and that are not wanted there: created
        by a held thread, they inherited its cgroup."""
        held = {key[0] for key in self.written}
        wanted = {key[0] for key in desired}
        strays = []
        for tid in self._members():
            if tid in held or tid in wanted:
                continue
            stat = procfs.read_task_stat(tid, tid)
            if stat is not None:
                strays.append((tid, stat.start_time))
        return strays

    def _read_quietly(self, key: ThreadKey) -> Optional[str]:
        try:
            return self.setting.read(key)
        except OSError:
            return None
