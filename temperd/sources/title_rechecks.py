"""Process titles set after a fork: a child forked without exec (PostgreSQL backends, prefork
workers) sets its title just after the fork event, and no event says so; its command line is read
again after TITLE_RECHECKS_S."""

from __future__ import annotations

import heapq
import time
from typing import List, Optional, Sequence, Tuple

from temperd.sources import procfs
from temperd.sources.changes import UPDATE, Change
from temperd.sources.process_store import ProcessStore

TITLE_RECHECKS_S = (0.05, 1.0)
MAX_PENDING_RECHECKS = 20000


class TitleRechecks:
    def __init__(self, store: ProcessStore, delays_s: Sequence[float] = TITLE_RECHECKS_S):
        self._store = store
        self._delays_s = tuple(delays_s)
        self._due: List[Tuple[float, int, int]] = []  # heap of (due, pid, start_time)

    @property
    def next_due(self) -> Optional[float]:
        """The monotonic time of the next recheck; None when none is pending."""
        return self._due[0][0] if self._due else None

    def schedule(self, pid: int) -> None:
        """A new process: its title read again after each delay (kernel threads have none)."""
        proc = self._store.procs.get(pid)
        if proc is None or proc.is_kernel_thread or len(self._due) >= MAX_PENDING_RECHECKS:
            return
        now = time.monotonic()
        for delay in self._delays_s:
            heapq.heappush(self._due, (now + delay, pid, proc.start_time))

    def run(self, changes: List[Change]) -> None:
        """The rechecks that are due; an UPDATE change for each title that changed."""
        now = time.monotonic()
        while self._due and self._due[0][0] <= now:
            _due, pid, start_time = heapq.heappop(self._due)
            proc = self._store.procs.get(pid)
            if proc is None or proc.start_time != start_time:
                continue
            cmdline = procfs.read_cmdline(pid, proc.live_tid())
            if cmdline and cmdline != proc.cmdline:
                proc.cmdline = cmdline
                self._store.touch(proc)
                changes.append(Change(UPDATE, pid))
