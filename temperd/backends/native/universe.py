"""The host threads the native backend last saw, by (tid, start time), with their ids indexed:
between whole applies the threads a batch ended are found by id without a pass over the host's
(a fork storm ends hundreds a second on a host of thousands)."""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Mapping, Set

from temperd.backends.native.membership import ThreadKey


class Universe(Dict[ThreadKey, Any]):
    """A (tid, start_time) -> thread mapping; change it only through put() and drop() (or
    replaced whole), which keep the index of start times by tid."""

    def __init__(self, threads: Iterable[Any] = ()) -> None:
        super().__init__(((t.tid, t.start_time), t) for t in threads)
        self._starts: Dict[int, Set[int]] = {}
        for tid, start in self:
            self._starts.setdefault(tid, set()).add(start)

    def put(self, thread: Any) -> None:
        self[(thread.tid, thread.start_time)] = thread
        starts = self._starts.get(thread.tid)
        if starts is None:
            self._starts[thread.tid] = {thread.start_time}
        else:
            starts.add(thread.start_time)

    def drop(self, key: ThreadKey) -> None:
        del self[key]
        starts = self._starts[key[0]]
        starts.discard(key[1])
        if not starts:
            del self._starts[key[0]]

    def ended(self, tids: Iterable[int], live: Mapping[int, Any]) -> List[ThreadKey]:
        """The keys of these ids that name no live thread (live: tid -> the thread alive now; a
        reused id names a new thread, which stays)."""
        dead = []
        for tid in set(tids):
            now = live.get(tid)
            dead.extend((tid, start) for start in self._starts.get(tid, ())
                        if now is None or now.start_time != start)
        return dead

    def clear(self) -> None:
        super().clear()
        self._starts.clear()
