"""A thread's held settings: its affinity, policy, nice and slice (ThreadRecord).

Each is a held setting with held.py's rules, keyed in the ledger (restore_ledger.py) by the
thread's (tid, start_time), so a recycled tid is never "restored" with another thread's values: a
record whose thread no longer runs with its start time is gone. A record is its own Setting: one
sched_getattr reads the policy, nice and slice, one sched_setattr writes them, and an affinity is
compared within the online CPUs (the ledger's: the daemon's machine shape's, else sysfs's).
"""

from __future__ import annotations

from typing import Any, Dict, FrozenSet, List, Mapping, Optional, Sequence, Tuple

from temperd.backends.native import sched
from temperd.backends.native.held import HeldSettings, Pending, Setting
from temperd.backends.result import ApplyResult
from temperd.sources import procfs
from temperd.sources.shape import online_cpus as sysfs_online_cpus

AFFINITY = "affinity"
POLICY = "policy"  # (policy, real-time priority)
NICE = "nice"
SLICE = "slice"
THREAD_KINDS = (AFFINITY, POLICY, NICE, SLICE)


def thread_values(affinity: FrozenSet[int], state: sched.SchedState) -> Dict[str, Any]:
    """A thread's settings by kind, as the kernel reports them (the slice: 0 when not reported)."""
    return {AFFINITY: affinity, POLICY: (state.policy, state.priority), NICE: state.nice, SLICE: state.slice_ns or 0}


def reported(kind: str, written: Any, online: FrozenSet[int]) -> Any:
    """What the kernel reports for a value temperd wrote, in as_read's terms (affinity: within the
    online CPUs; slice: as clamped)."""
    if kind == AFFINITY:
        return frozenset(written) & online
    return effective_slice(written) if kind == SLICE else written


def as_read(kind: str, current: Any) -> Any:
    """A value read from the kernel, in a form `reported` compares with."""
    return frozenset(current) if kind == AFFINITY else current


def effective_slice(requested_ns: int) -> int:
    """What the kernel will report after a write of requested_ns (0 = base slice; others clamped)."""
    support = sched.slice_support()
    if requested_ns == 0:
        return support.default_ns or 0
    low, high = support.min_ns or requested_ns, support.max_ns or requested_ns
    return max(low, min(high, requested_ns))


def _values(table: Mapping[str, Any]) -> Dict[str, Any]:
    """A record's values from the state file (a policy of an earlier version: without its priority)."""
    out = {}
    for kind, value in table.items():
        if kind not in THREAD_KINDS:
            raise ValueError(f"unknown setting kind {kind!r}")
        if kind == AFFINITY:
            out[kind] = tuple(int(c) for c in value)
        elif kind == POLICY:
            out[kind] = (int(value[0]), int(value[1])) if isinstance(value, list) else (int(value), 0)
        else:
            out[kind] = int(value)
    return out


def _json(table: Mapping[str, Any]) -> Dict[str, Any]:
    return {kind: list(value) if isinstance(value, tuple) else value for kind, value in table.items()}


class ThreadRecord(HeldSettings[str, Any], Setting[str, Any]):
    """One thread's held settings, by kind; its own Setting (it reads and writes its thread)."""

    kind = "thread"

    def __init__(self, tid: int, pid: int, start_time: int, comm: str, since: int = 0,
                 ledger: Any = None):
        HeldSettings.__init__(self, self)
        self.tid, self.pid, self.start_time, self.comm = tid, pid, start_time, comm
        # Since when (clock ticks after boot) the thread may carry temperd's treatment: when it was
        # recorded, or its start for a thread that inherited it; threads it made before did not.
        self.since = since  # 0: unknown (a state file of an earlier version): the thread's start
        self.ledger = ledger  # its RestoreLedger (the online CPUs, the values given back, refusals)
        self.ended = False  # a read or write found the thread gone
        self._now: Optional[Dict[str, Any]] = None  # its values, read once per restore

    @property
    def key(self) -> Tuple[int, int]:
        return self.tid, self.start_time

    def count_as(self, key: str) -> str:
        return key

    # ---- its Setting ---------------------------------------------------------------------------

    def read(self, kind: str) -> Any:
        if self._now is None:
            self._now = {}
            stat = procfs.read_thread_stat(self.tid)
            try:
                if stat is not None and stat.start_time == self.start_time:
                    self._now = thread_values(sched.get_affinity(self.tid), sched.get_sched(self.tid))
            except OSError as exc:
                if not sched.is_gone(exc):
                    raise
            self.ended = not self._now
        return self._now.get(kind)

    def write_many(self, values: Mapping[str, Any]) -> None:
        try:
            if AFFINITY in values:
                sched.set_affinity(self.tid, values[AFFINITY])
                return
            args: Dict[str, Any] = {}
            if POLICY in values:
                args["policy"], args["priority"] = values[POLICY]
            if NICE in values:
                args["nice"] = values[NICE]
            if SLICE in values:
                args["slice_ns"] = values[SLICE]
            sched.set_sched(self.tid, **args)
        except OSError as exc:
            self.ended = self.ended or sched.is_gone(exc)
            raise

    def together(self, pending: Sequence[Pending]) -> List[Sequence[Pending]]:
        """The affinity alone (sched_setaffinity), the rest in one sched_setattr."""
        alone = [item for item in pending if item[0] == AFFINITY]
        rest = [item for item in pending if item[0] != AFFINITY]
        return [group for group in (alone, rest) if group]

    def same(self, kind: str, written: Any, current: Any) -> bool:
        online = self.ledger.online if self.ledger is not None else frozenset(sysfs_online_cpus())
        return as_read(kind, current) == reported(kind, written, online if kind == AFFINITY else frozenset())

    def kept(self, kind: str, current: Any) -> Any:
        if kind == AFFINITY:
            return tuple(sorted(current))
        if kind == SLICE:
            support = sched.slice_support()
            return current if support.supported and current != support.default_ns else 0
        return current

    def where(self, kind: str) -> str:
        return f"tid {self.tid} ({self.comm}) {kind}"

    # ---- the ledger's hooks ----------------------------------------------------------------------

    def given_back(self, kind: str, written: Any, original: Any) -> None:
        if self.ledger is not None:
            self.ledger.given_back.note(self, kind, written, original)

    def refused(self, kinds: List[str], values: List[Any], exc: BaseException, result: ApplyResult) -> None:
        if self.ledger is not None and self.ledger.on_refused is not None:
            self.ledger.on_refused(self, kinds, exc, result)
        else:
            super().refused(kinds, values, exc, result)

    def restore_keys(self, keys: Sequence[str], result: ApplyResult) -> None:
        self._now = None
        super().restore_keys(keys, result)
        self._now = None

    # ---- state file ----------------------------------------------------------------------------

    def as_json(self) -> dict:
        return {"tid": self.tid, "pid": self.pid, "start_time": self.start_time, "comm": self.comm,
                "since": self.since, "originals": _json(self.originals), "written": _json(self.written),
                "drifted": _json(self.drifted)}

    @classmethod
    def from_json(cls, data: dict, ledger: Any = None) -> "ThreadRecord":
        rec = cls(int(data["tid"]), int(data["pid"]), int(data["start_time"]), str(data.get("comm", "")),
                  int(data.get("since", 0)), ledger)
        if "original" in data:  # an earlier version's: every kind's original, and what it `applied`
            was = data["original"]
            whole = {AFFINITY: was["affinity"], POLICY: [was["policy"], was.get("priority", 0)],
                     NICE: was["nice"], SLICE: was.get("slice_ns", 0)}
            written = data.get("applied", {})
            originals = {kind: whole[kind] for kind in _values(written)}
        else:
            originals, written = data["originals"], data.get("written", {})
        rec.originals.update(_values(originals))
        rec.written.update(_values(written))
        rec.drifted.update(_values(data.get("drifted", {})))
        return rec

    def copy(self) -> "ThreadRecord":
        """The record as it is now, for another ledger."""
        out = ThreadRecord(self.tid, self.pid, self.start_time, self.comm, self.since)
        out.originals, out.written, out.drifted = dict(self.originals), dict(self.written), dict(self.drifted)
        return out
