"""The processes of the workloads whose profile has a `busiest` group: their threads' runtimes
are read again before each match (the group ranks by the CPU grown since the last one).

Kept from one match to the next from what the match built again and ended (MatchResult.updated,
.ended), so that a batch of process events does not walk every live workload to find them.
"""

from __future__ import annotations

from typing import Dict, FrozenSet, List, Mapping, Optional, Tuple

from temperd.config.profile import Profile
from temperd.decide.matcher import MatchResult, Workload


class RankedProcesses:
    def __init__(self) -> None:
        self._pids: Dict[str, Tuple[int, ...]] = {}  # workload key -> its pids, for ranked workloads
        self._ranked: FrozenSet[str] = frozenset()  # the ids of the profiles with a `busiest` group
        self._workloads: Optional[List[Workload]] = None  # the match these were taken from

    def update(self, match: MatchResult, profiles: Mapping[str, Profile]) -> None:
        """Take the workloads of this match (the one after the last update's, or any: then all are looked at)."""
        ranked = frozenset(name for name, profile in profiles.items()
                           if any(group.busiest for group in profile.thread_groups))
        if not ranked:
            self._pids = {}  # most hosts: no workload looked at
        elif ranked != self._ranked or match.since is None or match.since is not self._workloads:
            self._pids = {w.key: w.pids for w in match.workloads if w.profile_id in ranked}
        else:
            for key in match.ended:
                self._pids.pop(key, None)
            for workload in match.updated:
                if workload.profile_id in ranked:
                    self._pids[workload.key] = workload.pids
                else:
                    self._pids.pop(workload.key, None)
        self._ranked, self._workloads = ranked, match.workloads

    def pids(self) -> List[int]:
        return [pid for pids in self._pids.values() for pid in pids]
