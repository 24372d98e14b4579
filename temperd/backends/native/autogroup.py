"""Autogroups: the nice of a whole session, for sessions that belong wholly to yield layers or
wholly to favoured (latency, exclusive) ones.

With kernel.sched_autogroup_enabled=1 (and tasks in the root cpu cgroup) every session gets its
own group entity, and nice, SCHED_IDLE and SCHED_BATCH only rank threads against others of the
same autogroup. Measured on a 6.18 kernel: a SCHED_IDLE (or nice 19) spinner and a normal
spinner pinned to one CPU split it ~2/98 in one session but 50/50 in two sessions. Across
sessions the controls that act are affinity and the autogroup's own nice (/proc/PID/autogroup),
which weighs the whole session's group entity.

So a session whose every thread yields gets autogroup nice 19, and one whose every thread is
favoured, with a negative nice among its layers, gets the lowest of those nices. A session that
mixes yield threads with others keeps its nice; its yield threads are the idle cgroup's to place
(idle_cgroup.py). Each autogroup nice is a held setting (held.py): original recorded first,
drift left to whoever made it, restored at the end.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Container, Dict, Iterable, List, Mapping, Optional, Set, Tuple

from temperd.backends.native.held import HeldSettings, Setting
from temperd.backends.native.sched import NICE_MAX, NICE_MIN
from temperd.backends.result import ApplyResult
from temperd.plan import YIELD, Layer
from temperd.sources import procfs

AUTOGROUP = "autogroup"
YIELD_NICE = 19
_FAVOURED = "favoured"
_UNTREATED = "none"
Groups = Dict[int, Optional[Tuple[str, int]]]  # pid -> its autogroup (name, nice), read in this batch


def autogroup_enabled() -> bool:
    try:
        with open("/proc/sys/kernel/sched_autogroup_enabled") as handle:
            return handle.read().strip() == "1"
    except OSError:
        return False


def read_autogroup(pid: int) -> Optional[Tuple[str, int]]:
    """(name, nice) of the process's autogroup, e.g. ('/autogroup-14', 0).

    None if the process is gone, the kernel lacks autogroup, or the process is in the root
    autogroup (init's session, e.g. a container's PID 1 session): the kernel prints nothing for it.
    """
    data = procfs.read_bytes(f"{procfs.PROC}/{pid}/autogroup", single=True)  # a batch reads one per process
    text = data.split() if data else ()
    if len(text) < 3 or text[1] != b"nice":
        return None
    return text[0].decode("utf-8", "replace"), int(text[2])


def set_autogroup_nice(pid: int, nice: int) -> None:
    """Weigh the whole autogroup (session) of pid: its group entity gets the weight of `nice`."""
    if not NICE_MIN <= nice <= NICE_MAX:
        raise ValueError(f"nice {nice} outside {NICE_MIN}..{NICE_MAX}")
    with open(f"/proc/{pid}/autogroup", "w") as handle:
        handle.write(str(nice))


def _start_time(pid: int) -> Optional[int]:
    stat = procfs.read_thread_stat(pid)
    return stat.start_time if stat else None


@dataclass
class Session:
    """The threads of one autogroup, as the plan sees them."""

    pid: int  # a process in it (a leader where one was seen): /proc/PID/autogroup reaches the group
    classes: Set[str] = field(default_factory=set)  # YIELD, favoured, none (untreated)
    nices: List[int] = field(default_factory=list)  # the nices of its favoured layers
    yielding: List[Any] = field(default_factory=list)  # its threads in yield layers

    @property
    def mixed(self) -> bool:
        """Yield threads beside others: their policy yields only inside the session."""
        return YIELD in self.classes and len(self.classes) > 1


def sessions(threads: Iterable, layer_for: Callable[[Any], Optional[Layer]],
             is_kernel_thread: Callable[[Any], bool], group_of: Callable[[int], Optional[Tuple[str, int]]],
             classes: Optional[Dict[Tuple[int, int], Tuple[str, str]]] = None) -> Dict[str, Session]:
    """The autogroups of these threads (kernel threads left out), by name. `group_of(pid)` finds a
    process's autogroup; it is asked once per process. classes: filled with each counted thread's
    (autogroup, class), by (tid, start time)."""
    found: Dict[str, Session] = {}
    groups: Dict[int, Optional[Tuple[str, int]]] = {}  # pid -> its autogroup, asked once
    for thread in threads:
        if is_kernel_thread(thread):
            continue
        if thread.pid not in groups:
            groups[thread.pid] = group_of(thread.pid)
        group = groups[thread.pid]
        if group is None:
            continue
        session = found.get(group[0])
        if session is None:
            session = found[group[0]] = Session(thread.pid)
        if thread.pid == thread.tid:
            session.pid = thread.pid
        layer = layer_for(thread)
        kind = class_of(layer)
        session.classes.add(kind)
        if kind == YIELD:
            session.yielding.append(thread)
        elif kind == _FAVOURED and layer is not None and layer.nice is not None:
            session.nices.append(layer.nice)
        if classes is not None:
            classes[(thread.tid, thread.start_time)] = (group[0], kind)
    return found


def class_of(layer: Optional[Layer]) -> str:
    """What a thread of this layer is to its session: yield, favoured, or untreated."""
    if layer is None:
        return _UNTREATED
    return YIELD if layer.treatment == YIELD else _FAVOURED


class SessionCache:
    """Which autogroup each process is in, read from /proc once per process where that is safe.

    A process leaves its autogroup only by setsid(), into a new session of its own; no process
    event says so. So a process is read again while it, or a process cached in the same autogroup,
    is treated: a treated process that moved, or a child read in its parent's treated session just
    before its setsid, is seen. Processes of untreated sessions are read once: their move cannot
    change a treated session's mix. Between whole applies (`touched`: the processes of the batch
    at hand) only the batch's processes are read on every pass, and the treated sessions' others
    every RECHECK_S: a fork storm's batches come ten a second, and each used to read every process
    of the storm's session."""

    RECHECK_S = 5.0

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._groups: Dict[Tuple[int, int], Optional[Tuple[str, int]]] = {}  # (pid, start) -> autogroup
        self._mattering: Set[str] = set()  # autogroups with a treated thread, as of the last pass
        self._clock = clock
        self._checked_at: Optional[float] = None  # the last pass that read every treated session's processes
        self._class_of: Dict[Tuple[int, int], Tuple[str, str]] = {}  # thread -> (autogroup, class), as counted
        self._counts: Dict[str, Dict[str, int]] = {}  # autogroup -> class -> threads

    def clear(self) -> None:
        self._groups.clear()
        self._mattering.clear()
        self._checked_at = None
        self._class_of.clear()
        self._counts.clear()

    def sessions(self, threads: Iterable, layer_for: Callable[[Any], Optional[Layer]],
                 is_kernel_thread: Callable[[Any], bool],
                 touched: Optional[Container[int]] = None) -> Dict[str, Session]:
        threads = list(threads)
        now = self._clock()
        recheck = touched is None or self._checked_at is None or now - self._checked_at >= self.RECHECK_S
        if recheck:
            self._checked_at = now
        starts: Dict[int, int] = {}  # pid -> the process's start time (its leader's, where seen)
        for thread in threads:
            if thread.tid == thread.pid or thread.pid not in starts:
                starts[thread.pid] = thread.start_time
        # Processes with a treated thread: read again only at a recheck.
        treated: Set[int] = {t.pid for t in threads if layer_for(t) is not None} if recheck else set()
        keys = {pid: (pid, start) for pid, start in starts.items()}
        groups = self._groups

        def group_of(pid: int) -> Optional[Tuple[str, int]]:
            key = keys[pid]
            cached = groups.get(key, _UNREAD)
            if cached is _UNREAD or (touched is not None and pid in touched) or (recheck and (
                    pid in treated or (cached is not None and cached[0] in self._mattering))):
                groups[key] = cached = read_autogroup(pid)
            return cached

        self._class_of = {}
        found = sessions(threads, layer_for, is_kernel_thread, group_of, self._class_of)
        live = set(keys.values())
        for key in [k for k in groups if k not in live]:
            del groups[key]
        self._mattering = {name for name, session in found.items() if session.classes - {_UNTREATED}}
        self._counts = {}
        for name, kind in self._class_of.values():
            counts = self._counts.setdefault(name, {})
            counts[kind] = counts.get(kind, 0) + 1
        return found

    def count(self, threads: Iterable, layer_for: Callable[[Any], Optional[Layer]],
              is_kernel_thread: Callable[[Any], bool],
              groups: Optional[Groups] = None) -> Optional[List[Tuple[Any, str, bool]]]:
        """Between whole passes: these threads (new, or in another layer now) counted into their
        sessions as the last pass counted every thread. Where that leaves every session with the
        classes it had (so the autogroups' nices and which sessions are mixed stay as they are),
        none of them is favoured (a favoured one may lower a session's nice) and no recheck is
        due: each thread with its class and whether its session is mixed. Else None, nothing
        counted: the caller makes the whole pass."""
        if self._checked_at is None or self._clock() - self._checked_at >= self.RECHECK_S:
            return None
        moves = []  # (key, the (autogroup, class) it was counted as, the one it is now)
        groups = {} if groups is None else groups  # the batch's processes, read now (as `touched`)
        for thread in threads:
            if is_kernel_thread(thread):
                continue
            key = (thread.tid, thread.start_time)
            before = self._class_of.get(key)
            kind = class_of(layer_for(thread))
            if kind == _FAVOURED or (before is not None and before[1] == _FAVOURED):
                return None
            if thread.pid not in groups:
                groups[thread.pid] = read_autogroup(thread.pid)
            group = groups[thread.pid]
            now = (group[0], kind) if group is not None else None
            if now is not None and now[0] not in self._counts:
                return None  # a session the last pass did not see
            moves.append((key, before, now, thread))
        names = {counted[0] for _key, before, now, _thread in moves for counted in (before, now) if counted is not None}
        counts = {name: dict(self._counts[name]) for name in names if name in self._counts}
        for _key, before, now, _thread in moves:
            if before is not None and before[0] in counts:
                counts[before[0]][before[1]] -= 1
            if now is not None:
                counts[now[0]][now[1]] = counts[now[0]].get(now[1], 0) + 1
        presents = {name: _present(after) for name, after in counts.items()}
        if any(present != _present(self._counts[name]) for name, present in presents.items()):
            return None
        self._counts.update(counts)
        mixed = {name: YIELD in present and len(present) > 1 for name, present in presents.items()}  # unchanged by this batch
        out = []
        for key, _before, now, thread in moves:
            if now is None:
                self._class_of.pop(key, None)
                continue
            self._class_of[key] = now
            out.append((thread, now[1], mixed[now[0]]))
        return out

    def forget(self, keys: Iterable[Tuple[int, int]]) -> None:
        """Threads that ended: out of the counts."""
        for key in keys:
            before = self._class_of.pop(key, None)
            if before is not None and before[0] in self._counts:
                self._counts[before[0]][before[1]] -= 1

    def changes_mix(self, threads: Iterable, layer_for: Callable[[Any], Optional[Layer]],
                    is_kernel_thread: Callable[[Any], bool], groups: Optional[Groups] = None) -> bool:
        """Whether these new threads can change what any autogroup should get: one of them is
        treated, or its process is in an autogroup that holds treated threads (a fork of a
        treated process). An untreated process in an untreated session changes nothing: no pass.
        groups: where each process's autogroup read here is kept (for count() in the same batch)."""
        pids = set()
        for thread in threads:
            if is_kernel_thread(thread):
                continue
            if layer_for(thread) is not None:
                return True
            pids.add(thread.pid)
        groups = {} if groups is None else groups
        for pid in pids:
            group = groups[pid] = read_autogroup(pid)
            if group is not None and group[0] in self._mattering:
                return True
        return False


_UNREAD: Any = object()


def _present(counts: Mapping[str, int]) -> Set[str]:
    """The classes a session holds threads of, from its counts."""
    return {kind for kind, n in counts.items() if n > 0}


def wanted_nices(found: Mapping[str, Session]) -> Dict[str, int]:
    """The nice each autogroup should have (mixed ones keep theirs)."""
    wanted: Dict[str, int] = {}
    for name, session in found.items():
        if session.classes == {YIELD}:
            wanted[name] = YIELD_NICE
        elif session.classes == {_FAVOURED} and session.nices and min(session.nices) < 0:
            wanted[name] = min(session.nices)
    return wanted


def mixed_note(name: str, session: Session, why: str) -> str:
    return (f"autogroup {name} (session of pid {session.pid}) mixes yield threads with others: their "
            f"SCHED_IDLE/BATCH only yields inside that session, and they stay in it: {why}")


class AutogroupNice(Setting[str, int]):
    """An autogroup's nice, keyed by the group's name and reached through a process in it."""

    kind = AUTOGROUP

    def __init__(self) -> None:
        self.members: Dict[str, Tuple[int, Optional[int]]] = {}  # name -> (pid, start_time) of a process in it

    def locate(self, name: str, pid: int, start_time: Optional[int] = None) -> None:
        """The group is reached through pid (start_time: its start time where already read)."""
        self.members[name] = (pid, start_time if start_time is not None else _start_time(pid))

    def read(self, name: str) -> Optional[int]:
        """None when no process is in the group any more. The process that reached it may have
        ended, or moved to another session, while others stay in it: then one of them reaches it
        (a session whose processes all yield, or are all favoured, may lose the one it was reached
        through first; its nice must still go back)."""
        pid, start_time = self.members.get(name, (0, None))
        if pid and _start_time(pid) == start_time:
            found = read_autogroup(pid)
            if found is not None and found[0] == name:
                return found[1]
        for other in procfs.list_pids():  # rare: only once the process that reached it is gone
            found = read_autogroup(other)
            started = _start_time(other) if found is not None and found[0] == name else None
            if started is not None:
                self.locate(name, other, started)
                return found[1]
        return None

    def write(self, name: str, nice: int) -> None:
        set_autogroup_nice(self.members[name][0], nice)

    def where(self, name: str) -> str:
        pid = self.members.get(name, (None, None))[0]
        return f"autogroup {name} (pid {pid})"

    def shown(self, nice: int) -> str:
        return f"nice {nice}"


class Autogroups(HeldSettings[str, int]):
    """Holds the nice of autogroups whose threads all yield, or are all favoured."""

    def __init__(self) -> None:
        self.groups = AutogroupNice()
        self.cache = SessionCache()
        self.mixed: Dict[str, Session] = {}  # as of the last pass: sessions of yield threads beside others
        super().__init__(self.groups)

    def apply(self, threads: Iterable, layer_for: Callable[[Any], Optional[Layer]],
              is_kernel_thread: Callable[[Any], bool],
              before_write: Optional[Callable[[], None]] = None, reread: bool = True,
              touched: Optional[Container[int]] = None) -> ApplyResult:
        """Weigh the autogroups of these threads (the host's) as their members' layers ask.
        reread: read every process's autogroup anew (else SessionCache decides which; touched:
        the processes of the batch at hand, between whole applies)."""
        if reread:
            self.cache.clear()
        found = self.cache.sessions(threads, layer_for, is_kernel_thread, None if reread else touched)
        wanted = wanted_nices(found)
        self.mixed = {name: session for name, session in found.items() if session.mixed}
        for name, session in found.items():
            if name in wanted or name in self.written:
                self.groups.locate(name, session.pid)
        return self.hold(wanted, before_write)

    def state(self) -> Dict[str, Any]:
        section = super().state()
        if section:
            section["members"] = {name: list(self.groups.members[name]) for name in self.written
                                  if name in self.groups.members}
        return section

    def adopt_state(self, section: Mapping[str, Any]) -> None:
        if not isinstance(section.get("written"), dict):
            # The earlier layout: {name: {"pid", "start_time", "original", "written"}}.
            section = {"originals": {n: g["original"] for n, g in section.items()},
                       "written": {n: g["written"] for n, g in section.items()},
                       "members": {n: [g["pid"], g.get("start_time")] for n, g in section.items()}}
        for name, (pid, start_time) in (section.get("members") or {}).items():
            self.groups.members.setdefault(name, (int(pid), None if start_time is None else int(start_time)))
        super().adopt_state(section)
