"""Which workload each matched process belongs to, kept from one match to the next.

A workload is named by its key: the unit of its processes, or, for a process tree without a
unit, "<profile>:pid<root>" where the root is the topmost ancestor with the same decision. A
match after a batch of process events decides again only the processes whose facts changed
(the inventory makes a new, immutable ProcessFacts for every change), and names again only
those and, where one's standing as an ancestor changed (matched or not, its profile, its trust,
its parent), its descendants. The keys whose members changed are dirty: only their workloads
are built again (a fork storm's batch touches a few dozen processes of a host of thousands).
"""

from __future__ import annotations

from typing import Any, Callable, Collection, Dict, Iterable, Mapping, Optional, Set, Tuple

from temperd.sources.facts import ProcessFacts

Decide = Callable[[Any], Optional[Any]]  # a process -> its decision (profile, tier, source, distrust), or None


class Grouping:
    def __init__(self) -> None:
        self.procs: Mapping[int, Any] = {}  # pid -> the facts last matched
        self.decisions: Dict[int, Any] = {}  # pid -> its decision, for matched processes
        self.members: Dict[str, Set[int]] = {}  # workload key -> its pids
        self._keys: Dict[int, str] = {}  # pid -> its workload key
        self._children: Dict[int, Set[int]] = {}  # ppid -> pids

    def update(self, procs: Mapping[int, Any], decide: Decide, everything: bool = False,
               changed_pids: Optional[Collection[int]] = None) -> Set[str]:
        """Take the host's processes now; the keys whose members or their facts changed.
        everything: decide every process again (its decision depends on more than its facts).
        changed_pids: the pids whose facts are not those of the last update (the inventory
        knows them): the others are not compared, and `procs`, an immutable mapping, is kept as it is."""
        before = self.procs
        if everything:
            changed = set(procs) | set(before)
        elif changed_pids is not None:
            changed = set(changed_pids)
        else:
            changed = {pid for pid, proc in procs.items()
                       if before.get(pid) is not proc or not isinstance(proc, ProcessFacts)}
            changed.update(pid for pid in before if pid not in procs)
        standing = {pid: self._standing(pid) for pid in changed}
        for pid in changed:
            old, new = before.get(pid), procs.get(pid)
            if old is not None and (new is None or new.ppid != old.ppid):
                siblings = self._children.get(old.ppid)
                if siblings is not None:
                    siblings.discard(pid)
                    if not siblings:
                        del self._children[old.ppid]
            if new is not None:
                self._children.setdefault(new.ppid, set()).add(pid)
            decision = decide(new) if new is not None else None
            if decision is None:
                self.decisions.pop(pid, None)
            else:
                self.decisions[pid] = decision
        self.procs = procs if changed_pids is not None and not everything else dict(procs)
        return self._rename(changed | self._descendants(
            [pid for pid in changed if self._standing(pid) != standing[pid]]))

    def _standing(self, pid: int) -> Optional[Tuple[Any, bool, int]]:
        """What the keys of a process's descendants read of it."""
        decision = self.decisions.get(pid)
        if decision is None:
            return None
        return decision.profile, bool(decision.distrust), self.procs[pid].ppid

    def _descendants(self, pids: Iterable[int]) -> Set[int]:
        out: Set[int] = set()
        stack = list(pids)
        while stack:
            for child in self._children.get(stack.pop(), ()):
                if child not in out:
                    out.add(child)
                    stack.append(child)
        return out

    def _rename(self, pids: Set[int]) -> Set[str]:
        dirty: Set[str] = set()
        for pid in pids:
            old = self._keys.pop(pid, None)
            if old is not None:
                dirty.add(old)
                members = self.members[old]
                members.discard(pid)
                if not members:
                    del self.members[old]
            if pid in self.decisions:
                key = self.key(pid)
                self._keys[pid] = key
                self.members.setdefault(key, set()).add(pid)
                dirty.add(key)
        return dirty

    def key(self, pid: int) -> str:
        procs, decisions = self.procs, self.decisions
        proc, decision = procs[pid], decisions[pid]
        pid_of = decision.profile.id if decision.profile else "tier"
        if proc.unit:
            return f"{proc.unit}" if decision.source not in ("env", "bind") else f"{proc.unit}/{pid_of}"
        # Without a unit: the topmost ancestor with the same decision roots the workload.
        root = pid
        parent = proc.ppid
        while (parent in decisions and decisions[parent].profile == decision.profile
               and bool(decisions[parent].distrust) == bool(decision.distrust) and parent != root):
            root = parent
            parent = procs[root].ppid
        return f"{pid_of}:pid{root}"
