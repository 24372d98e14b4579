"""Which processes each inventory snapshot made again, for the last few snapshots: what the
matcher is told changed since the snapshot it last matched, so that it compares no other
process (a fork storm's batch changes a few dozen of a host's thousands)."""

from __future__ import annotations

import collections
from typing import Deque, FrozenSet, Iterable, Optional, Set, Tuple

CHANGE_LOG = 64  # snapshots whose changes since() can still add up


class ChangeLog:
    def __init__(self) -> None:
        # (the generation of a snapshot, that of the one made from it, the pids made again)
        self._entries: Deque[Tuple[int, int, FrozenSet[int]]] = collections.deque(maxlen=CHANGE_LOG)

    def clear(self) -> None:
        """A snapshot made from scratch: no earlier one is known to differ from it by a few pids."""
        self._entries.clear()

    def add(self, base: int, made: int, pids: Iterable[int]) -> None:
        """The snapshot of generation `made` was made from that of `base` by making these pids again."""
        self._entries.append((base, made, frozenset(pids)))

    def since(self, generation: Optional[int], latest: int) -> Optional[FrozenSet[int]]:
        """The pids whose facts differ between the snapshots of `generation` and `latest`; None
        where the log does not reach back to it (then every process is to be compared)."""
        if generation is None:
            return None
        out: Set[int] = set()
        want = latest
        for base, made, pids in reversed(self._entries):
            if want == generation:
                break
            if made != want:
                return None
            out.update(pids)
            want = base
        return frozenset(out) if want == generation else None
