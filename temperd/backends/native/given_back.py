"""Values temperd wrote on a thread and has since replaced or given back, remembered a while.

A thread made while its creator carried one of temperd's values inherits that value; temperd may
see the new thread only after it changed the creator again (a layer change, a demotion, a stop
restoring the creator first). The creator's record then no longer holds the value the new thread
has, and without this memory the new thread would keep it as if it were its own (seen: a thread
made while its creator was in a latency layer kept that layer's nice after the creator got a core back).
inheritance.Creators looks here when no creator carries the value now.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, FrozenSet, Iterable, List, Optional, Set

from temperd.backends.native.thread_settings import ThreadRecord, reported
from temperd.sources import procfs
from temperd.sources.procfs import CLOCK_TICKS

KEEP_S = 120.0  # a thread made before the change is seen within a pass or two; stop sweeps at once
WRITE_SLACK_S = 2.0  # the write itself follows the decision within the same pass
MAX_PER_PROCESS = 64


@dataclass(frozen=True)
class GivenBackValue:
    kind: str
    written: Any  # what temperd had written
    original: Any  # the thread's original, which a thread made while it carried `written` gets back
    since: int  # clock ticks after boot: from when the thread carried it (its record's since)
    until: int  # ... and until when, at the latest


class GivenBack:
    """Per process: the values temperd replaced or gave back on its threads, for KEEP_S."""

    def __init__(self) -> None:
        self._by_pid: Dict[int, List[GivenBackValue]] = {}

    def note(self, rec: ThreadRecord, kind: str, written: Any, original: Any) -> None:
        """`rec`'s value of `kind` is replaced or given back (now, or within WRITE_SLACK_S)."""
        now = procfs.boot_ticks()
        kept = _recent(self._by_pid.get(rec.pid, ()), now)
        kept.append(GivenBackValue(kind, written, original, rec.since or rec.start_time,
                                   now + int(WRITE_SLACK_S * CLOCK_TICKS)))
        self._by_pid[rec.pid] = kept[-MAX_PER_PROCESS:]

    def find(self, pid: int, kind: str, current_key: Any, start_time: int,
             online: FrozenSet[int]) -> Optional[GivenBackValue]:
        """The latest value of `kind` given back in `pid` that a thread started at `start_time`
        with `current_key` (restore_ledger.as_read) may have inherited."""
        for value in reversed(self._by_pid.get(pid, ())):
            if (value.kind == kind and value.since <= start_time <= value.until
                    and reported(kind, value.written, online) == current_key):
                return value
        return None

    def prune(self) -> None:
        """Drop what is older than KEEP_S (processes that ended included)."""
        now = procfs.boot_ticks()
        kept = {pid: _recent(values, now) for pid, values in self._by_pid.items()}
        self._by_pid = {pid: values for pid, values in kept.items() if values}

    def holds(self, pid: int) -> bool:
        """Whether anything given back in `pid` is remembered."""
        return bool(self._by_pid.get(pid))

    def pids(self) -> Set[int]:
        return set(self._by_pid)

    def clear(self) -> None:
        self._by_pid.clear()


def _recent(values: Iterable[GivenBackValue], now: int) -> List[GivenBackValue]:
    """The values given back within KEEP_S of `now` (boot ticks)."""
    return [v for v in values if v.until >= now - KEEP_S * CLOCK_TICKS]
