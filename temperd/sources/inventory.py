"""Every process and thread on the host, kept current by process events and repaired by scans.

Process events (fork/clone, exec, comm, exit from the netlink proc connector) keep the store
current within milliseconds; `reconcile()` scans /proc and repairs whatever events missed
(overflow, a daemon restart, hosts without the connector). Identity across pid reuse is
(pid, start_time). Tasks that vanish between an event and the read of /proc are normal and
only counted.

Not thread-safe: callers serialise access. In the daemon the main loop, a reload asked for on the
control socket's thread and the /observe handler on an HTTP thread each hold the daemon's one lock
around every call. Listeners receive, after each
`handle_events()` or `reconcile()`, the list of changes it made. A process-level change
("new_process", "reused", "exec") stands for all of that process's threads; no per-thread
change is reported alongside it.
"""

from __future__ import annotations

import heapq
import logging
import os
import time
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Tuple

from temperd.sources import procfs
from temperd.sources.facts import ProcessFacts, ThreadFacts
from temperd.sources.process_store import ZOMBIE_STATES, InventorySnapshot, ProcessRecord, ProcessStore, thread_facts
from temperd.sources.proc_connector import Batch, ConnectorUnavailable, ProcConnector, ProcEvent

log = logging.getLogger("temperd.sources.inventory")

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")

# Change kinds. "update": the command line (process title), cgroup or owner changed without an exec,
# found by a scan: servers rewrite their title, tools move processes between cgroups.
NEW_PROCESS = "new_process"
NEW_THREAD = "new_thread"
EXEC = "exec"
RENAME = "rename"
EXIT = "exit"
REUSED = "reused"
UPDATE = "update"
CHANGE_KINDS = (NEW_PROCESS, NEW_THREAD, EXEC, RENAME, EXIT, REUSED, UPDATE)
_WHOLE_PROCESS = frozenset((NEW_PROCESS, REUSED, EXEC))

# A child forked without exec (PostgreSQL backends, prefork workers) sets its process title just
# after the fork event; no event says so, so its command line is read again after these delays.
TITLE_RECHECKS_S = (0.05, 1.0)
MAX_PENDING_RECHECKS = 20000


@dataclass(frozen=True)
class Change:
    kind: str  # one of CHANGE_KINDS
    pid: int
    tid: Optional[int] = None  # None: the change concerns the whole process
    comm: Optional[str] = None  # new_thread, rename: the thread's name
    old_comm: Optional[str] = None  # rename: the name before


@dataclass(frozen=True)
class ReconcileSummary:
    changes: Tuple[Change, ...]
    processes: int
    threads: int
    duration_s: float
    cpu_s: float

    def count(self, kind: str) -> int:
        return sum(1 for change in self.changes if change.kind == kind)

    def describe(self) -> str:
        counts = ", ".join(f"{k} {self.count(k)}" for k in CHANGE_KINDS if self.count(k))
        return (
            f"{self.processes} processes, {self.threads} threads; {counts or 'no changes'}; "
            f"{self.cpu_s * 1e3:.1f} ms CPU"
        )


@dataclass(frozen=True)
class InventoryStats:
    events_active: bool
    events_received: int
    events_lost: int  # receive-buffer overflows (ENOBUFS); each lost an unknown number of events
    vanished: int  # tasks gone between event or listing and read: normal, counted only
    reconciles: int
    last_reconcile_duration_s: float
    last_reconcile_cpu_s: float
    processes: int
    threads: int
    last_event_lag_s: float  # kernel timestamp of the last event to its handling
    max_event_lag_s: float


Listener = Callable[[List[Change]], None]


class Inventory:
    """The store. Typical loop: start(); then select() on the inventory (fileno) with
    poll_timeout() as the timeout, handle_events() when it wakes, and reconcile() every so often
    (every few seconds where events_active is False, rarely otherwise)."""

    def __init__(self, rcvbuf_bytes: int = 4 << 20, resync_min_interval_s: float = 1.0,
                 ack_timeout_s: float = 1.0, title_rechecks_s: Tuple[float, ...] = TITLE_RECHECKS_S):
        self._store = ProcessStore()
        self._listeners: List[Listener] = []
        self._connector: Optional[ProcConnector] = None
        self._rcvbuf_bytes = rcvbuf_bytes
        self._resync_min_interval_s = resync_min_interval_s
        self._ack_timeout_s = ack_timeout_s
        self._title_rechecks_s = tuple(title_rechecks_s)
        self._rechecks: List[Tuple[float, int, int]] = []  # heap of (due, pid, start_time)
        self._resync_pending = False
        self._last_reconcile_at = float("-inf")
        self._notice_logged = False
        self._events_received = 0
        self._events_lost = 0
        self._vanished = 0
        self._reconciles = 0
        self._last_duration_s = 0.0
        self._last_cpu_s = 0.0
        self._last_lag_s = 0.0
        self._max_lag_s = 0.0
        self.unavailable_reason: Optional[str] = None

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> bool:
        """Subscribe to events, then scan: in this order nothing falls between the two.
        Returns whether events are active (otherwise the caller reconciles periodically)."""
        active = self.start_events()
        self.reconcile()
        return active

    def start_events(self) -> bool:
        """Open the proc connector. False (with one notice line) where it is unavailable."""
        if self._connector is not None:
            return True
        connector = ProcConnector(rcvbuf_bytes=self._rcvbuf_bytes)
        try:
            connector.open(self._ack_timeout_s)
        except ConnectorUnavailable as exc:
            self.unavailable_reason = str(exc)
            if not self._notice_logged:
                log.warning("process events unavailable: %s; falling back to scanning /proc", exc)
                self._notice_logged = True
            return False
        self._connector = connector
        self.unavailable_reason = None
        return True

    def stop_events(self) -> None:
        if self._connector is not None:
            self._connector.close()
            self._connector = None

    close = stop_events

    @property
    def events_active(self) -> bool:
        return self._connector is not None

    @property
    def connector(self) -> Optional[ProcConnector]:
        return self._connector

    def fileno(self) -> int:
        """The event socket, for select()/poll(); ValueError when events are not active."""
        if self._connector is None:
            raise ValueError("process events are not active")
        return self._connector.fileno()

    @property
    def needs_reconcile(self) -> bool:
        """Events were lost and the rescan is still due (rate-limited in handle_events)."""
        return self._resync_pending

    def poll_timeout(self) -> Optional[float]:
        """Seconds until handle_events() has timed work due (a title recheck), None if none:
        the longest a caller may wait on fileno() before calling handle_events() anyway."""
        due = []
        if self._rechecks:
            due.append(self._rechecks[0][0])
        if self._resync_pending:
            due.append(self._last_reconcile_at + self._resync_min_interval_s)
        if not due:
            return None
        return max(0.0, min(due) - time.monotonic())

    def subscribe(self, callback: Listener) -> Callable[[], None]:
        """Call `callback(changes)` after every update that changed something; returns an unsubscribe."""
        self._listeners.append(callback)

        def unsubscribe() -> None:
            if callback in self._listeners:
                self._listeners.remove(callback)

        return unsubscribe

    # -- queries ----------------------------------------------------------------------------

    @property
    def processes(self) -> Mapping[int, ProcessFacts]:
        return self._store.snapshot().processes

    def process(self, pid: int) -> Optional[ProcessFacts]:
        return self._store.process(pid)

    def thread(self, tid: int) -> Optional[ThreadFacts]:
        return self._store.thread(tid)

    def snapshot(self) -> InventorySnapshot:
        return self._store.snapshot()

    @property
    def stats(self) -> InventoryStats:
        return InventoryStats(
            events_active=self.events_active,
            events_received=self._events_received,
            events_lost=self._events_lost,
            vanished=self._vanished,
            reconciles=self._reconciles,
            last_reconcile_duration_s=self._last_duration_s,
            last_reconcile_cpu_s=self._last_cpu_s,
            processes=len(self._store.procs),
            threads=len(self._store.tid_pid),
            last_event_lag_s=self._last_lag_s,
            max_event_lag_s=self._max_lag_s,
        )

    # -- events -----------------------------------------------------------------------------

    def handle_events(self, max_events: int = 100000) -> List[Change]:
        """Drain pending events into the store; a lost-events overflow triggers a rescan
        (at most once per resync_min_interval_s; `needs_reconcile` says one is still due)."""
        changes: List[Change] = []
        if self._connector is not None:
            batch = self._connector.drain(max_events)
            self._apply_batch(batch, changes)
        if self._rechecks:
            self._run_title_rechecks(changes)
        if self._resync_pending and time.monotonic() - self._last_reconcile_at >= self._resync_min_interval_s:
            changes.extend(self._reconcile(notify=False).changes)
        self._notify(changes)
        return changes

    def _apply_batch(self, batch: Batch, changes: List[Change]) -> None:
        if batch.overflowed:
            self._events_lost += 1
            self._resync_pending = True
            log.debug("process events lost (receive buffer overflow); rescanning /proc")
        for event in batch.events:
            self.apply_event(event, changes)
        if batch.events:
            lag = max(0.0, (time.monotonic_ns() - batch.events[-1].timestamp_ns) / 1e9)
            self._last_lag_s = lag
            if lag > self._max_lag_s:
                self._max_lag_s = lag

    def apply_event(self, event: ProcEvent, changes: List[Change]) -> None:
        """Apply one event to the store, appending what changed (listeners are not called)."""
        self._events_received += 1
        kind = event.kind
        if kind == "fork":
            self._on_task_appeared(event.pid, event.tid, changes)
            if event.tid == event.pid:
                self._schedule_title_rechecks(event.pid)
        elif kind == "exec":
            self._on_exec(event.pid, changes)
        elif kind == "comm":
            self._on_comm(event.pid, event.tid, event.comm or "", changes)
        elif kind == "exit":
            self._on_exit(event.pid, event.tid, changes)

    def _on_task_appeared(self, pid: int, tid: int, changes: List[Change]) -> None:
        proc = self._store.procs.get(pid)
        if proc is None or tid == pid:
            self._on_process_appeared(pid, changes)
            return
        stat = procfs.read_task_stat(pid, tid)
        if stat is None:
            self._vanished += 1
            return
        old = proc.threads.get(tid)
        if old is not None and old.start_time == stat.start_time:
            return
        info = thread_facts(pid, tid, stat, None)
        if info is None:
            self._vanished += 1
            return
        self._store.put_thread(proc, info)
        self._store.touch(proc)
        changes.append(Change(REUSED if old is not None else NEW_THREAD, pid, tid, comm=info.comm))

    def _on_process_appeared(self, pid: int, changes: List[Change]) -> None:
        old = self._store.procs.get(pid)
        if old is not None:
            leader = procfs.read_task_stat(pid, pid)
            if leader is None:
                self._vanished += 1
                return
            if old.start_time == leader.start_time:
                return  # already known (a scan saw it first)
        proc = self._store.read_process(pid)
        if proc is None:
            self._vanished += 1
            return
        self._store.install(proc)
        changes.append(Change(REUSED if old is not None else NEW_PROCESS, pid))

    def _on_exec(self, pid: int, changes: List[Change]) -> None:
        old = self._store.procs.get(pid)
        proc = self._store.read_process(pid)
        if proc is None:
            self._vanished += 1
            return
        if old is None:
            kind = NEW_PROCESS
        elif old.start_time != proc.start_time:
            kind = REUSED
        else:
            kind = EXEC
            proc.execs = old.execs + 1
        self._store.install(proc)
        changes.append(Change(kind, pid))

    def _on_comm(self, pid: int, tid: int, comm: str, changes: List[Change]) -> None:
        proc = self._store.procs.get(pid)
        old = proc.threads.get(tid) if proc is not None else None
        if old is None:
            self._on_task_appeared(pid, tid, changes)
            return
        if old.comm == comm:
            return
        self._store.put_thread(proc, _replace(old, comm=comm))
        self._store.touch(proc)
        changes.append(Change(RENAME, pid, tid, comm=comm, old_comm=old.comm))

    def _on_exit(self, pid: int, tid: int, changes: List[Change]) -> None:
        proc = self._store.procs.get(pid)
        if proc is None or tid not in proc.threads:
            return
        self._store.drop_thread(proc, tid)
        if proc.threads:
            # Another thread lives on (a leader that called pthread_exit, or exit_group under way).
            self._store.touch(proc)
            changes.append(Change(EXIT, pid, tid))
        else:
            self._store.remove_process(pid)
            changes.append(Change(EXIT, pid))

    def _schedule_title_rechecks(self, pid: int) -> None:
        proc = self._store.procs.get(pid)
        if proc is None or proc.is_kernel_thread or len(self._rechecks) >= MAX_PENDING_RECHECKS:
            return
        now = time.monotonic()
        for delay in self._title_rechecks_s:
            heapq.heappush(self._rechecks, (now + delay, pid, proc.start_time))

    def _run_title_rechecks(self, changes: List[Change]) -> None:
        now = time.monotonic()
        while self._rechecks and self._rechecks[0][0] <= now:
            _due, pid, start_time = heapq.heappop(self._rechecks)
            proc = self._store.procs.get(pid)
            if proc is None or proc.start_time != start_time:
                continue
            cmdline = procfs.read_cmdline(pid, proc.live_tid())
            if cmdline and cmdline != proc.cmdline:
                proc.cmdline = cmdline
                self._store.touch(proc)
                changes.append(Change(UPDATE, pid))

    # -- scanning ---------------------------------------------------------------------------

    def reconcile(self) -> ReconcileSummary:
        """Scan /proc and make the store equal to it; returns what changed."""
        return self._reconcile(notify=True)

    def _reconcile(self, notify: bool) -> ReconcileSummary:
        wall0 = time.monotonic()
        cpu0 = time.thread_time()
        changes: List[Change] = []
        seen = set()
        for pid in procfs.list_pids():
            stats = procfs.read_thread_stats(pid)
            if stats is None:
                continue
            leader = stats.get(pid)
            if leader is None:
                continue
            old = self._store.procs.get(pid)
            if old is None or old.start_time != leader.start_time:
                proc = self._store.read_process(pid, stats)
                if proc is None:
                    continue
                self._store.install(proc)
                changes.append(Change(REUSED if old is not None else NEW_PROCESS, pid))
            elif not self._rescan_process(old, leader, stats, changes):
                continue
            seen.add(pid)
        for pid in [pid for pid in self._store.procs if pid not in seen]:
            self._store.remove_process(pid)
            changes.append(Change(EXIT, pid))
        self._resync_pending = False
        self._last_reconcile_at = time.monotonic()
        self._reconciles += 1
        self._last_duration_s = self._last_reconcile_at - wall0
        self._last_cpu_s = time.thread_time() - cpu0
        summary = ReconcileSummary(
            changes=tuple(changes),
            processes=len(self._store.procs),
            threads=len(self._store.tid_pid),
            duration_s=self._last_duration_s,
            cpu_s=self._last_cpu_s,
        )
        if notify:
            self._notify(changes)
        return summary

    def _rescan_process(self, proc: ProcessRecord, leader: procfs.TaskStat, stats: Dict[int, procfs.TaskStat],
                        changes: List[Change]) -> bool:
        """Bring a known process up to date; False if it turned out to be gone (or a zombie)."""
        pid = proc.pid
        dirty = False
        whole = None  # a process-level change that stands for its threads
        if proc.ppid != leader.ppid:
            proc.ppid = leader.ppid
            dirty = True
        if not proc.is_kernel_thread:
            via = None
            if leader.state in ZOMBIE_STATES:
                via = next((tid for tid, st in stats.items() if st.state not in ZOMBIE_STATES), None)
            # None or empty means unreadable right now (an exiting process): keep the old.
            exe = procfs.read_exe(pid, via) or proc.exe
            cmdline = procfs.read_cmdline(pid, via) or proc.cmdline
            cgroup = procfs.read_cgroup(pid)
            old_cgroup = (proc.cgroup, proc.cgroup_systemd)
            new_cgroup = old_cgroup if cgroup is None else (cgroup.unified, cgroup.systemd)
            # setuid() without an exec sends no event: the scan sees the new owner
            uid = procfs.read_uid(pid, via)
            uid = proc.uid if uid is None else uid
            if exe != proc.exe:
                whole = EXEC  # an exec whose event was lost
                proc.execs += 1
            elif cmdline != proc.cmdline or new_cgroup != old_cgroup or uid != proc.uid:
                changes.append(Change(UPDATE, pid))
            if whole is not None or cmdline != proc.cmdline or new_cgroup != old_cgroup or uid != proc.uid:
                proc.exe = exe
                proc.cmdline = cmdline
                proc.uid = uid
                proc.set_cgroup(cgroup)
                dirty = True
        threads = proc.threads
        thread_changes: List[Change] = []
        live = set()
        for tid, stat in stats.items():
            if stat.state in ZOMBIE_STATES:
                continue
            affinity = procfs.read_affinity(tid, pid)
            if affinity is None:
                continue
            live.add(tid)
            old = threads.get(tid)
            if old is None:
                thread_changes.append(Change(NEW_THREAD, pid, tid, comm=stat.comm))
                runtime = None
            elif old.start_time != stat.start_time:
                thread_changes.append(Change(REUSED, pid, tid, comm=stat.comm))
                runtime = None
            else:
                if (old.comm == stat.comm and old.last_cpu == stat.last_cpu and old.nice == stat.nice
                        and old.policy == stat.policy and old.affinity == affinity):
                    continue  # unchanged: keep the record (most threads, most scans)
                if old.comm != stat.comm:
                    thread_changes.append(Change(RENAME, pid, tid, comm=stat.comm, old_comm=old.comm))
                runtime = old.runtime_ns
            self._store.put_thread(proc, thread_facts(pid, tid, stat, runtime, affinity))
            dirty = True
        if len(live) != len(threads):
            for tid in [tid for tid in threads if tid not in live]:
                self._store.drop_thread(proc, tid)
                thread_changes.append(Change(EXIT, pid, tid))
                dirty = True
        if not threads:
            return False
        if dirty:
            self._store.touch(proc)
        if whole is not None:
            changes.append(Change(whole, pid))
        else:
            changes.extend(thread_changes)
        return True

    # -- runtime ----------------------------------------------------------------------------

    def refresh_runtime(self, pids: Iterable[int]) -> None:
        """Read the CPU time of every thread of these processes (for "N busiest" selection)."""
        for pid in pids:
            proc = self._store.procs.get(pid)
            if proc is None:
                continue
            changed = False
            for tid, info in list(proc.threads.items()):
                runtime = procfs.read_runtime_ns(pid, tid)
                if runtime is None:
                    self._vanished += 1
                    continue
                if runtime != info.runtime_ns:
                    proc.threads[tid] = _replace(info, runtime_ns=runtime)
                    changed = True
            if changed:
                self._store.touch(proc)

    def _notify(self, changes: List[Change]) -> None:
        if not changes:
            return
        for listener in list(self._listeners):
            listener(changes)


def _replace(info: ThreadFacts, **updates) -> ThreadFacts:
    fields = dict(info.__dict__)
    fields.update(updates)
    return ThreadFacts(**fields)
