"""Which layer each thread belongs to, and which threads are kernel threads.

The plan names its members by tid; threads that appear later are placed by the layers' rules
(workload pids or cgroup, then thread-name globs, process-title regexes, catch-all).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Optional, Tuple

from temperd.config.schema import glob_match
from temperd.plan import Layer, LayerPlan
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

    def __init__(self, plan: LayerPlan):
        self.by_tid: Dict[int, Layer] = {}
        for layer in plan.layers:
            for tid in layer.selector.tids:
                self.by_tid.setdefault(tid, layer)
        self.rule_layers = [l for l in plan.layers if l.selector.pids or l.selector.cgroup]
        # Rule layers by the pids they name (a plan has a layer per workload and group: under a
        # fork storm hundreds), and those that name a cgroup; each with its place in the plan.
        self._by_pid: Dict[int, List[Tuple[int, Layer]]] = {}
        self._by_cgroup: List[Tuple[int, Layer]] = []
        for place, layer in enumerate(self.rule_layers):
            for pid in layer.selector.pids:
                self._by_pid.setdefault(pid, []).append((place, layer))
            if layer.selector.cgroup:
                self._by_cgroup.append((place, layer))
        self._titles: Dict[int, str] = {}
        self._cgroups: Dict[int, Tuple[Optional[str], Optional[str]]] = {}
        # A thread's layer by what decides it beyond the cached title and cgroup of its process:
        # a pass asks for every host thread's layer several times (treatment, autogroups).
        self._found: Dict[Tuple[int, int, str], Optional[Layer]] = {}

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
        found = dict(self._by_pid.get(pid, ()))
        if self._by_cgroup:
            cgroups = self._cgroup(pid)
            found.update((place, layer) for place, layer in self._by_cgroup if layer.selector.cgroup in cgroups)
        return [found[place] for place in sorted(found)]

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
            if layer.selector.catch_all:
                return layer
        return None
