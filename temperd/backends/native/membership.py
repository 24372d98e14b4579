"""Which layer each thread belongs to, and which threads are kernel threads.

The plan names its members by tid; threads that appear later are placed by the layers' rules
(workload pids or cgroup, then thread-name globs, process-title regexes, catch-all).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Optional, Tuple

from temperd.config.schema import glob_match
from temperd.plan import Layer, LayerPlan, layer_changes
from temperd.sources import procfs

ThreadKey = Tuple[int, int]  # (tid, start_time): a thread, across tid reuse


@dataclass(frozen=True)
class ThreadRef:
    """The minimum the backend needs to know about a thread (the inventory's ThreadFacts also fits)."""

    tid: int
    pid: int
    start_time: int
    comm: str
    is_kernel_thread: Optional[bool] = None  # None: the backend reads it from /proc


def scan_threads(pids: Optional[Iterable[int]] = None) -> List[ThreadRef]:
    """Threads of the given processes (all of the host by default), read from /proc."""
    out: List[ThreadRef] = []
    for pid in (procfs.list_pids() if pids is None else pids):
        stats = procfs.read_thread_stats(pid)
        if not stats:
            continue
        leader = stats.get(pid) or next(iter(stats.values()))
        kthread = procfs.is_kernel_thread(pid, leader)
        for tid, stat in sorted(stats.items()):
            if stat.state in ("Z", "X", "x"):
                continue
            out.append(ThreadRef(tid, pid, stat.start_time, stat.comm, kthread))
    return out


class KernelThreads:
    """Whether a thread is a kernel thread: as the thread says, else read from /proc once."""

    def __init__(self) -> None:
        self._known: Dict[ThreadKey, bool] = {}

    def __call__(self, thread: Any) -> bool:
        value = getattr(thread, "is_kernel_thread", None)
        if value is None:
            key = (thread.tid, thread.start_time)
            value = self._known.get(key)
            if value is None:
                stat = procfs.read_thread_stat(thread.tid)
                value = self._known[key] = bool(stat and procfs.is_kernel_thread(thread.tid, stat))
        return bool(value)

    def keep_only(self, keys: Iterable[ThreadKey]) -> None:
        """Forget threads that are not among `keys` (the host's threads now)."""
        keep = set(keys)
        self._known = {k: v for k, v in self._known.items() if k in keep}

    def clear(self) -> None:
        self._known.clear()


class Membership:
    """Which layer a thread belongs to: the plan's tids first, then the selectors' rules (new threads)."""

    def __init__(self, plan: LayerPlan, previous: Optional["Membership"] = None):
        """previous: the membership of the plan in force, which this one takes over (its pid
        index is changed in place, for the layers the plans do not share): a fork storm changes
        a few layers a batch, and the plan has hundreds."""
        self.plan = plan
        self.by_tid: Dict[int, Layer] = plan.members.by_tid  # the plan's own: not to be changed
        # Layers by the pids they name (a plan has a layer per workload and group: under a fork
        # storm hundreds), and those that name a cgroup.
        if previous is None:
            self._by_pid: Dict[int, List[Layer]] = {}
            removed, added = (), plan.layers
        else:
            self._by_pid = previous._by_pid
            previous._by_pid = {}  # taken over: that membership is out of use
            removed, added = layer_changes(previous.plan, plan)
        # Each layer's place in the plan: a thread's candidate layers are tried in plan order.
        self._place, self._next = self._places(plan, previous, removed, added)
        for layer in removed:
            for pid in layer.selector.pids:
                named = self._by_pid[pid]
                named[:] = [other for other in named if other is not layer]  # by identity: layers compare by value
                if not named:
                    del self._by_pid[pid]
        for layer in added:
            for pid in layer.selector.pids:
                self._by_pid.setdefault(pid, []).append(layer)
        if previous is None or any(layer.selector.cgroup for layer in (*removed, *added)):
            self._by_cgroup = [layer for layer in plan.layers if layer.selector.cgroup]
        else:
            self._by_cgroup = previous._by_cgroup
        self._titles: Dict[int, str] = {}
        self._cgroups: Dict[int, Tuple[Optional[str], Optional[str]]] = {}
        # A thread's layer by what decides it beyond the cached title and cgroup of its process:
        # a pass asks for every host thread's layer several times (treatment, autogroups).
        self._found: Dict[Tuple[int, int, str], Optional[Layer]] = {}

    @staticmethod
    def _places(plan: LayerPlan, previous: Optional["Membership"], removed, added) -> Tuple[Dict[int, int], int]:
        """Layer id -> its place, and the next place. A plan that is the previous one less the
        layers removed, with those added at its end (a delta, decide/plan_delta.py), takes over
        the previous places: a batch of events costs its own layers, not a walk over the plan's."""
        layers = plan.layers
        if (previous is not None and len(layers) == len(previous.plan.layers) - len(removed) + len(added)
                and all(a is b for a, b in zip(layers[len(layers) - len(added):], added))):
            place, at = previous._place, previous._next
            previous._place = {}  # taken over
            for layer in removed:
                del place[id(layer)]
            for layer in added:
                place[id(layer)] = at
                at += 1
            return place, at
        return {id(layer): at for at, layer in enumerate(layers)}, len(layers)

    def forget_processes(self) -> None:
        """Drop cached titles and cgroups (pids get reused)."""
        self._titles.clear()
        self._cgroups.clear()
        self._found.clear()

    def _title(self, pid: int) -> str:
        if pid not in self._titles:
            self._titles[pid] = " ".join(procfs.read_cmdline(pid) or ())
        return self._titles[pid]

    def _cgroup(self, pid: int) -> Tuple[Optional[str], Optional[str]]:
        if pid not in self._cgroups:
            paths = procfs.read_cgroup(pid)
            self._cgroups[pid] = (paths.unified, paths.systemd) if paths else (None, None)
        return self._cgroups[pid]

    def _workload_layers(self, pid: int) -> List[Layer]:
        """The rule layers whose workload holds this process (its pid, or its cgroup), in plan order."""
        place = self._place
        found = {place[id(layer)]: layer for layer in self._by_pid.get(pid, ())}
        if self._by_cgroup:
            cgroups = self._cgroup(pid)
            found.update((place[id(layer)], layer) for layer in self._by_cgroup if layer.selector.cgroup in cgroups)
        return [found[at] for at in sorted(found)]

    def layer_for(self, thread: Any) -> Optional[Layer]:
        layer = self.by_tid.get(thread.tid)
        if layer is not None:
            return layer
        key = (thread.tid, thread.pid, thread.comm)
        if key not in self._found:
            self._found[key] = self._by_rules(thread)
        return self._found[key]

    def _by_rules(self, thread: Any) -> Optional[Layer]:
        candidates = self._workload_layers(thread.pid)
        for layer in candidates:
            sel = layer.selector
            if any(glob_match(p, thread.comm) for p in sel.comm_patterns):
                return layer
            if sel.title_patterns:
                title = self._title(thread.pid)
                if title and any(re.search(p, title) for p in sel.title_patterns):
                    return layer
        for layer in candidates:
            if layer.selector.catch_all and not self._excluded(layer.selector, thread):
                return layer
        return None

    def _excluded(self, sel, thread: Any) -> bool:
        """Whether a catch-all leaves the thread alone: a group without a layer claims it."""
        if thread.tid in sel.excluded_tids or any(glob_match(p, thread.comm) for p in sel.excluded_comm_patterns):
            return True
        title = self._title(thread.pid) if sel.excluded_title_patterns else ""
        return bool(title) and any(re.search(p, title) for p in sel.excluded_title_patterns)
