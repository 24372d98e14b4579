"""What temperd changed on which thread, and what was there before: the way back.

Every thread is keyed by (tid, start_time), so a recycled tid is never "restored" with another
thread's values. The original affinity/policy/nice/slice is recorded once, before the first
change; `applied` holds what temperd set. The ledger is kept in the state file (state_file.py)
before each round of changes, so a temperd that was killed can be undone by the next start. The
state file also carries the sections of the host settings temperd holds (held.py: PM QoS
bounds, cgroup weights, autogroup nices, the idle cgroup) in `extras`.

Drift: when a re-read value differs from what temperd set, someone else changed it (an affinity
compared within the online CPUs: the daemon's machine shape's, else sysfs's when made without one). The ledger
marks that setting as theirs (temperd stops enforcing it: no fight loop) and does not restore
it later either; the result counts it.

These are the rules of held settings (held.py), kept per thread rather than per setting: one
sched_getattr reads a thread's policy, nice and slice, and one sched_setattr writes them.
"""

from __future__ import annotations

import copy
import functools
import logging
import os
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, FrozenSet, Iterable, List, Mapping, Optional, Set, Tuple

from temperd.backends.native import sched
from temperd.backends.native.state_file import StateFile, StateFileError
from temperd.backends.result import ApplyResult
from temperd.sources import procfs
from temperd.sources.shape import online_cpus as sysfs_online_cpus

AFFINITY = "affinity"
POLICY = "policy"
NICE = "nice"
SLICE = "slice"
THREAD_KINDS = (AFFINITY, POLICY, NICE, SLICE)
_SCHED_KINDS = (POLICY, NICE, SLICE)

STATE_FILE = "native-state.json"
_SHOWN = 10  # skipped entries named in the warning

log = logging.getLogger(__name__)


class LedgerError(Exception):
    """The state file exists but cannot be used; the message names the file and the problem."""


@dataclass(frozen=True)
class Original:
    affinity: Tuple[int, ...]
    policy: int
    priority: int
    nice: int
    slice_ns: int  # 0: the kernel's base slice (no custom slice)

    def value(self, kind: str) -> Any:
        return {AFFINITY: self.affinity, POLICY: self.policy, NICE: self.nice, SLICE: self.slice_ns}[kind]

    @classmethod
    def read(cls, tid: int) -> "Original":
        """The thread's current settings (raises OSError, ESRCH when gone)."""
        return cls.of(sched.get_affinity(tid), sched.get_sched(tid))

    @classmethod
    def of(cls, affinity: FrozenSet[int], state: sched.SchedState) -> "Original":
        return cls(affinity=tuple(sorted(affinity)), policy=state.policy, priority=state.priority, nice=state.nice,
                   slice_ns=custom_slice_of(state))


def thread_values(affinity: FrozenSet[int], state: sched.SchedState) -> Dict[str, Any]:
    """A thread's settings by kind, as the kernel reports them (the slice: 0 when not reported)."""
    return {AFFINITY: affinity, POLICY: state.policy, NICE: state.nice, SLICE: state.slice_ns or 0}


def custom_slice_of(state: sched.SchedState) -> int:
    support = sched.slice_support()
    if not support.supported or not state.slice_ns or state.slice_ns == support.default_ns:
        return 0
    return state.slice_ns


def reported(kind: str, written: Any, online: FrozenSet[int]) -> Any:
    """What the kernel reports for a value temperd wrote, in as_read's terms (affinity: within the
    online CPUs; slice: as clamped)."""
    if kind == AFFINITY:
        return frozenset(written) & online
    if kind == SLICE:
        return effective_slice(written)
    return tuple(written) if isinstance(written, list) else written


def as_read(kind: str, current: Any) -> Any:
    """A value read from the kernel (or from the state file), in a form `reported` compares with."""
    if kind == AFFINITY:
        return frozenset(current)
    return tuple(current) if isinstance(current, list) else current


def effective_slice(requested_ns: int) -> int:
    """What the kernel will report after a write of requested_ns (0 = base slice; others clamped)."""
    support = sched.slice_support()
    if requested_ns == 0:
        return support.default_ns or 0
    low, high = support.min_ns or requested_ns, support.max_ns or requested_ns
    return max(low, min(high, requested_ns))


@dataclass
class ThreadRecord:
    tid: int
    pid: int
    start_time: int
    comm: str
    original: Original
    applied: Dict[str, Any] = field(default_factory=dict)  # kind -> value temperd set
    drifted: Dict[str, Any] = field(default_factory=dict)  # kind -> value someone else set instead
    # Since when (clock ticks after boot) the thread may carry temperd's treatment: when it was
    # recorded, or its start for a thread that inherited it; threads it made before did not.
    since: int = 0  # 0: unknown (a state file of an earlier version): the thread's start

    @property
    def key(self) -> Tuple[int, int]:
        return self.tid, self.start_time

    def as_json(self) -> dict:
        return {
            "tid": self.tid, "pid": self.pid, "start_time": self.start_time, "comm": self.comm,
            "original": {"affinity": list(self.original.affinity), "policy": self.original.policy,
                         "priority": self.original.priority, "nice": self.original.nice,
                         "slice_ns": self.original.slice_ns},
            "applied": {k: list(v) if k == AFFINITY else v for k, v in self.applied.items()},
            "drifted": {k: list(v) if k == AFFINITY else v for k, v in self.drifted.items()},
            "since": self.since,
        }

    @classmethod
    def from_json(cls, data: dict) -> "ThreadRecord":
        orig = data["original"]

        def values(table: dict) -> Dict[str, Any]:
            out = {}
            for kind, value in table.items():
                if kind not in THREAD_KINDS:
                    raise ValueError(f"unknown setting kind {kind!r}")
                out[kind] = tuple(int(c) for c in value) if kind == AFFINITY else int(value)
            return out

        return cls(tid=int(data["tid"]), pid=int(data["pid"]), start_time=int(data["start_time"]),
                   comm=str(data.get("comm", "")),
                   original=Original(affinity=tuple(int(c) for c in orig["affinity"]), policy=int(orig["policy"]),
                                     priority=int(orig.get("priority", 0)), nice=int(orig["nice"]),
                                     slice_ns=int(orig.get("slice_ns", 0))),
                   applied=values(data.get("applied", {})), drifted=values(data.get("drifted", {})),
                   since=int(data.get("since", 0)))


class _Watched(dict):
    """A record's applied or drifted values, saying when they change (the state file then
    compares only the records that changed since its last save)."""

    __slots__ = ("_changed",)

    def __init__(self, values: Mapping[str, Any], changed: Callable[[], None]):
        super().__init__(values)
        self._changed = changed

    def __setitem__(self, key: str, value: Any) -> None:
        super().__setitem__(key, value)
        self._changed()

    def __delitem__(self, key: str) -> None:
        super().__delitem__(key)
        self._changed()

    def pop(self, key: str, *default: Any) -> Any:
        if key in self:
            self._changed()
        return super().pop(key, *default)

    def popitem(self) -> Any:
        item = super().popitem()  # KeyError where empty: nothing changed
        self._changed()
        return item

    def setdefault(self, key: str, default: Any = None) -> Any:
        if key not in self:
            self._changed()
        return super().setdefault(key, default)

    def update(self, *args: Any, **kwargs: Any) -> None:
        super().update(*args, **kwargs)
        self._changed()

    def clear(self) -> None:
        super().clear()
        self._changed()

    def __deepcopy__(self, memo: Dict[int, Any]) -> Dict[str, Any]:
        return copy.deepcopy(dict(self), memo)  # a copy is nobody's to watch


class RestoreLedger:
    def __init__(self, state_dir: str, filename: str = STATE_FILE,
                 online_cpus: Optional[Callable[[], FrozenSet[int]]] = None):
        self.state_dir = state_dir
        # The online CPUs an affinity is compared within: the daemon's machine shape, else sysfs now.
        self.online_cpus = online_cpus or (lambda: frozenset(sysfs_online_cpus()))
        self.path = os.path.join(state_dir, filename)
        self.records: Dict[Tuple[int, int], ThreadRecord] = {}  # add with record() or add()
        self._by_pid: Dict[int, Dict[Tuple[int, int], ThreadRecord]] = {}
        self.extras: Dict[str, Any] = {}  # the held host settings' sections (PM QoS, cgroup weights, autogroups)
        self.file = StateFile(self.path)
        self._changed: Set[Tuple[int, int]] = set()  # records added, forgotten or changed since the last save
        # The records that hold a setting (held()), and those changed since it last counted.
        self._holding: Set[Tuple[int, int]] = set()
        self._recount: Set[Tuple[int, int]] = set()
        # Told (record, kind) before a value temperd wrote is given back (given_back.GivenBack.note).
        self.on_give_back: Optional[Callable[[ThreadRecord, str], None]] = None
        self.skipped: List[str] = []  # the state file's entries load() could not read
        self._failing = False  # the last save failed (said once, until one succeeds)

    # ---- records ------------------------------------------------------------------------------

    def get(self, tid: int, start_time: int) -> Optional[ThreadRecord]:
        return self.records.get((tid, start_time))

    def record(self, tid: int, pid: int, start_time: int, comm: str, original: Original,
               since: Optional[int] = None) -> ThreadRecord:
        """The thread's record, created with `original` if this is the first change to it (since:
        from when it may carry temperd's treatment; now by default)."""
        rec = self.records.get((tid, start_time))
        if rec is None:
            rec = ThreadRecord(tid, pid, start_time, comm, original, since=procfs.boot_ticks() if since is None else since)
            self.add(rec)
        return rec

    def add(self, rec: ThreadRecord) -> None:
        key = rec.key
        mark = functools.partial(self._mark, key)
        rec.applied = _Watched(rec.applied, mark)
        rec.drifted = _Watched(rec.drifted, mark)
        self.records[key] = rec
        self._by_pid.setdefault(rec.pid, {})[key] = rec
        self._mark(key)

    def _mark(self, key: Tuple[int, int]) -> None:
        self._changed.add(key)
        self._recount.add(key)

    def held(self) -> int:
        """How many threads have a setting temperd holds (counted again only for the records
        changed since the last call: a fork storm's batches come tens a second)."""
        for key in self._recount:
            rec = self.records.get(key)
            if rec is not None and rec.applied:
                self._holding.add(key)
            else:
                self._holding.discard(key)
        self._recount.clear()
        return len(self._holding)

    def by_pid(self, pid: int) -> List[ThreadRecord]:
        return [rec for rec in self._by_pid.get(pid, {}).values() if self.records.get(rec.key) is rec]

    def pids(self) -> Set[int]:
        """The processes with threads in the ledger."""
        return set(self._by_pid)

    def forget(self, rec: ThreadRecord) -> None:
        self._mark(rec.key)
        self.records.pop(rec.key, None)
        same = self._by_pid.get(rec.pid)
        if same is not None:
            same.pop(rec.key, None)
            if not same:
                del self._by_pid[rec.pid]

    def clear(self) -> None:
        self._changed.update(self.records)
        self._recount.update(self.records)
        self.records.clear()
        self._by_pid.clear()

    def copy(self) -> "RestoreLedger":
        """The records as they are now (not saved anywhere): who had what written, after they are restored."""
        out = RestoreLedger(self.state_dir, os.path.basename(self.path), self.online_cpus)
        for rec in self.records.values():
            out.add(copy.deepcopy(rec))
        return out

    # ---- drift --------------------------------------------------------------------------------

    def matches(self, rec: ThreadRecord, kind: str, current: Any, online: FrozenSet[int]) -> bool:
        """Whether `current` is what temperd set for this kind."""
        return as_read(kind, current) == reported(kind, rec.applied[kind], online)

    def mark_drift(self, rec: ThreadRecord, kind: str, found: Any) -> None:
        rec.drifted[kind] = tuple(sorted(found)) if kind == AFFINITY else found
        rec.applied.pop(kind, None)

    def current_values(self, tid: int) -> Dict[str, Any]:
        """Affinity, policy, nice and (reported) slice of a live thread; OSError if it is gone."""
        return thread_values(sched.get_affinity(tid), sched.get_sched(tid))

    # ---- restore ------------------------------------------------------------------------------

    def alive(self, rec: ThreadRecord) -> bool:
        """Whether the thread still runs: its tid names a thread with the recorded start time."""
        stat = procfs.read_thread_stat(rec.tid)
        return stat is not None and stat.start_time == rec.start_time

    def restore(self, rec: ThreadRecord, kinds: Optional[Iterable[str]] = None,
                online: Optional[FrozenSet[int]] = None) -> ApplyResult:
        """Put back the original of each applied kind (all, or `kinds`) that nobody else changed since."""
        out = ApplyResult()
        todo = [k for k in (kinds if kinds is not None else THREAD_KINDS) if k in rec.applied]
        if not todo:
            if not rec.applied and not self.alive(rec):
                out.gone += 1
                self.forget(rec)
            else:
                self._maybe_forget(rec)
            return out
        online = online if online is not None else self.online_cpus()
        try:
            if not self.alive(rec):
                out.gone += 1
                self.forget(rec)
                return out
            current = self.current_values(rec.tid)
            for kind in list(todo):
                if not self.matches(rec, kind, current[kind], online):
                    self.mark_drift(rec, kind, current[kind])
                    out.bump(out.drift, kind)
                    todo.remove(kind)
            if AFFINITY in todo:
                self._put_back(rec, [AFFINITY], out,
                               lambda: sched.set_affinity(rec.tid, rec.original.affinity))
            sched_kinds = [k for k in todo if k in _SCHED_KINDS]
            if sched_kinds:
                args: Dict[str, Any] = {}
                if POLICY in sched_kinds:
                    args.update(policy=rec.original.policy, priority=rec.original.priority)
                if NICE in sched_kinds:
                    args["nice"] = rec.original.nice
                if SLICE in sched_kinds:
                    args["slice_ns"] = rec.original.slice_ns
                self._put_back(rec, sched_kinds, out, lambda: sched.set_sched(rec.tid, **args))
        except OSError as exc:
            if not sched.is_gone(exc):
                raise
            out.gone += 1
            self.forget(rec)
            return out
        self._maybe_forget(rec)
        return out

    def _put_back(self, rec: ThreadRecord, kinds: List[str], out: ApplyResult, action) -> None:
        try:
            action()
        except OSError as exc:
            if sched.is_gone(exc):
                raise
            for kind in kinds:
                out.bump(out.failed, kind)
                rec.applied.pop(kind, None)  # a failed restore is reported once, not retried forever
            out.errors.append(f"tid {rec.tid} ({rec.comm}): restoring {'/'.join(kinds)}: {exc.strerror or exc}")
            return
        for kind in kinds:
            out.bump(out.restored, kind)
            if self.on_give_back is not None:
                self.on_give_back(rec, kind)
            rec.applied.pop(kind, None)

    def _maybe_forget(self, rec: ThreadRecord) -> None:
        # A record with drifted settings stays while the thread lives: it remembers not to
        # enforce those again, even if the thread leaves and rejoins a layer.
        if not rec.applied and not rec.drifted:
            self.forget(rec)

    def restore_all(self) -> ApplyResult:
        out = ApplyResult()
        online = self.online_cpus()
        for rec in list(self.records.values()):
            out.merge(self.restore(rec, online=online))
        return out

    # ---- state file ----------------------------------------------------------------------------

    def is_empty(self) -> bool:
        return not any(rec.applied for rec in self.records.values()) and not any(self.extras.values())

    def save(self) -> None:
        """Bring the state file up to date (state_file.py: this call's changes appended, or the
        file written whole); remove it when nothing is left to undo."""
        changed = set(self._changed)
        self._changed.clear()  # the same set: the records' values hold its add()
        if self.is_empty():
            self.delete()
            return
        try:
            self.file.save(self.records, self.extras, changed)
        except BaseException:
            self._changed |= changed  # compared again at the next save
            raise

    def try_save(self) -> Optional[str]:
        """save(), or why it failed (OSError: no space left, an I/O error): the caller then
        makes none of the changes it was to record. Logged once until a save succeeds again
        (a fork storm's batches come ten a second)."""
        holds = not self.is_empty()  # a save that only removes the file says nothing of the disk
        try:
            self.save()
        except OSError as exc:
            message = (f"{self.path}: cannot write the state file: {exc.strerror or exc}; "
                       "the changes it would record are not made until it can be written")
            if not self._failing:
                log.error("%s", message)
            self._failing = True
            return message
        if self._failing and holds:
            log.warning("%s: the state file is written again; changes are made again", self.path)
            self._failing = False
        return None

    def delete(self) -> None:
        self.file.delete()

    def set_aside(self, error: LedgerError) -> str:
        """A state file that cannot be used, renamed NAME.unreadable (kept for a look, never
        read again); the error line, logged."""
        aside = self.path + ".unreadable"
        try:
            os.replace(self.path, aside)
            kept = f"moved to {aside}"
        except OSError as exc:
            kept = f"left in place ({exc.strerror or exc}) to be replaced at the first save"
        message = f"{error}; {kept}, nothing restored from it"
        log.error("%s", message)
        return message

    def remove_stale_temp_files(self) -> List[str]:
        return self.file.remove_stale_temp_files()

    def load(self) -> bool:
        """Read a state file left by an earlier run into this ledger; False when there is none.
        LedgerError: none of it can be used. An entry that cannot be read is skipped, the others
        are kept, and one warning names the skipped ones (`skipped`)."""
        try:
            found = self.file.load()
        except StateFileError as exc:
            raise LedgerError(str(exc)) from None
        if found is None:
            return False
        threads, sections = found
        skipped = list(self.file.skipped)
        for where, item in threads:
            try:
                self.add(ThreadRecord.from_json(item))
            except (KeyError, TypeError, ValueError, AttributeError):
                skipped.append(where)
        self.extras.update(sections)
        self.skipped = sorted(skipped, key=_position)
        if skipped:
            shown = ", ".join(self.skipped[:_SHOWN]) + (", ..." if len(skipped) > _SHOWN else "")
            log.warning("%s: %d malformed entr%s skipped (%s); every other entry is restored",
                        self.path, len(skipped), "y" if len(skipped) == 1 else "ies", shown)
        return True


def _position(where: str) -> int:
    """The line (or list index) a state-file entry's `where` names, to list them in file order."""
    number = re.search(r"\d+", where)
    return int(number.group()) if number else 0
