"""The ledger: what temperd holds and what was there before, the way back, journalled in one
state file (state_file.py) that a start after a kill undoes.

Every change is a held setting with held.py's rules: each thread's affinity, policy, nice and
slice (thread_settings.ThreadRecord, keyed by (tid, start_time)) in `records`, and the sections of
the host settings (PM QoS bounds, cgroup weights, autogroup nices) in `extras`. The values its
threads were given back are remembered a while (`given_back`, given_back.py), for threads their
creators made while they carried them (inheritance.py).
"""

from __future__ import annotations

import functools
import logging
import os
import re
from typing import Any, Callable, Dict, FrozenSet, List, Mapping, Optional, Set, Tuple

from temperd.backends.native.given_back import GivenBack
from temperd.backends.native.state_file import StateFile, StateFileError
from temperd.backends.native.thread_settings import THREAD_KINDS, ThreadRecord
from temperd.backends.result import ApplyResult
from temperd.sources import procfs
from temperd.sources.shape import online_cpus as sysfs_online_cpus

STATE_FILE = "native-state.json"
_SHOWN = 10  # skipped entries named in the warning

log = logging.getLogger(__name__)


class _Watched(dict):
    """A record's originals, written or drifted values, saying when they change (the state file then
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
        self.given_back = GivenBack()  # the values temperd replaced or gave back on threads, for a while
        # Told (record, kinds, error, result) of writes the kernel refused.
        self.on_refused: Optional[Callable[[ThreadRecord, List[str], BaseException, ApplyResult], None]] = None
        self.online: FrozenSet[int] = frozenset()  # the online CPUs as now_online() last read them
        self.skipped: List[str] = []  # the state file's entries load() could not read
        self._failing = False  # the last save failed (said once, until one succeeds)
        # The records added, forgotten or changed since follow() was last called; None before its
        # first call (nothing follows the ledger: inheritance.Creators kept across passes does).
        self._followed: Optional[Set[Tuple[int, int]]] = None

    # ---- records ------------------------------------------------------------------------------

    def get(self, tid: int, start_time: int) -> Optional[ThreadRecord]:
        return self.records.get((tid, start_time))

    def record(self, tid: int, pid: int, start_time: int, comm: str, since: Optional[int] = None) -> ThreadRecord:
        """The thread's record, created if this is the first change to it (since: from when it may
        carry temperd's treatment; now by default)."""
        rec = self.records.get((tid, start_time))
        if rec is None:
            rec = ThreadRecord(tid, pid, start_time, comm, procfs.boot_ticks() if since is None else since)
            self.add(rec)
        return rec

    def add(self, rec: ThreadRecord) -> None:
        key = rec.key
        mark = functools.partial(self._mark, key)
        rec.ledger = self
        rec.originals = _Watched(rec.originals, mark)
        rec.written = _Watched(rec.written, mark)
        rec.drifted = _Watched(rec.drifted, mark)
        replaced = self.records.get(key)
        if replaced is not None and replaced.pid != rec.pid:
            self._unindex(key, replaced.pid)  # a malformed state file's: the same thread in two processes
        self.records[key] = rec
        self._by_pid.setdefault(rec.pid, {})[key] = rec
        self._mark(key)

    def _mark(self, key: Tuple[int, int]) -> None:
        self._changed.add(key)
        self._recount.add(key)
        if self._followed is not None:
            self._followed.add(key)

    def follow(self) -> Set[Tuple[int, int]]:
        """The keys of the records added, forgotten or changed since the last call (none at the first)."""
        taken, self._followed = self._followed or set(), set()
        return taken

    def held(self) -> int:
        """How many threads have a setting temperd holds (counted again only for the records
        changed since the last call: a fork storm's batches come tens a second)."""
        for key in self._recount:
            rec = self.records.get(key)
            if rec is not None and rec.written:
                self._holding.add(key)
            else:
                self._holding.discard(key)
        self._recount.clear()
        return len(self._holding)

    def by_pid(self, pid: int) -> List[ThreadRecord]:
        # add(), forget() and clear() change `records` and this index together: no stale entry.
        return list(self._by_pid.get(pid, {}).values())

    def pids(self) -> Set[int]:
        """The processes with threads in the ledger."""
        return set(self._by_pid)

    def holds_pid(self, pid: Optional[int]) -> bool:
        """Whether the ledger has threads of this process."""
        return pid in self._by_pid

    def holds_any(self) -> bool:
        """Whether the ledger has threads of any process."""
        return bool(self._by_pid)

    def forget(self, rec: ThreadRecord) -> None:
        self._mark(rec.key)
        held = self.records.pop(rec.key, None)
        self._unindex(rec.key, rec.pid)
        if held is not None and held.pid != rec.pid:
            self._unindex(rec.key, held.pid)

    def _unindex(self, key: Tuple[int, int], pid: int) -> None:
        same = self._by_pid.get(pid)
        if same is not None:
            same.pop(key, None)
            if not same:
                del self._by_pid[pid]

    def clear(self) -> None:
        self._changed.update(self.records)
        self._recount.update(self.records)
        if self._followed is not None:
            self._followed.update(self.records)
        self.records.clear()
        self._by_pid.clear()

    def copy(self) -> "RestoreLedger":
        """The records as they are now (not saved anywhere): who had what written, after they are restored."""
        out = RestoreLedger(self.state_dir, os.path.basename(self.path), self.online_cpus)
        for rec in self.records.values():
            out.add(rec.copy())
        out.online = self.online
        return out

    def now_online(self) -> FrozenSet[int]:
        """The online CPUs, read again for a pass (an affinity is compared within them)."""
        self.online = frozenset(self.online_cpus())
        return self.online

    # ---- restore ------------------------------------------------------------------------------

    def restore(self, rec: ThreadRecord, online: Optional[FrozenSet[int]] = None) -> ApplyResult:
        """Put back the original of each kind written that nobody else changed since."""
        out = ApplyResult()
        self.online = online if online is not None else self.now_online()
        rec.restore_keys([k for k in THREAD_KINDS if k in rec.written], out)
        self.settle(rec, out)
        return out

    def settle(self, rec: ThreadRecord, result: ApplyResult) -> None:
        """After changes to a record: forgotten where its thread is gone (counted) or it holds nothing.
        A record with drifted settings stays while the thread lives: it remembers not to enforce
        those again, even if the thread leaves and rejoins a layer."""
        if rec.ended:
            result.gone += 1
            self.forget(rec)
        elif not rec.written and not rec.drifted:
            self.forget(rec)

    def restore_all(self) -> ApplyResult:
        """Every thread's originals put back, and every record forgotten (what drifted included)."""
        out = ApplyResult()
        online = self.now_online()
        for rec in list(self.records.values()):
            out.merge(self.restore(rec, online=online))
        self.clear()
        return out

    # ---- state file ----------------------------------------------------------------------------

    def is_empty(self) -> bool:
        return not any(rec.written for rec in self.records.values()) and not any(self.extras.values())

    def save(self) -> None:
        """Bring the state file up to date (state_file.py: this call's changes appended, or the
        file written whole); remove it when nothing is left to undo."""
        changed = set(self._changed)
        self._changed.clear()  # the same set: the records' values hold its add()
        if self.is_empty():
            self.file.delete()
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

    def set_aside(self, error: StateFileError) -> str:
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

    def load(self) -> bool:
        """Read a state file left by an earlier run into this ledger; False when there is none.
        StateFileError: none of it can be used. An entry that cannot be read is skipped, the
        others are kept, and one warning names the skipped ones (`skipped`)."""
        found = self.file.load()
        if found is None:
            return False
        threads, sections = found
        skipped = list(self.file.skipped)
        for where, item in threads:
            try:
                self.add(ThreadRecord.from_json(item, self))
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
