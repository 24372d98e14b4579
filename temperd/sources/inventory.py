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

import dataclasses
import logging
import time
from typing import Callable, Iterable, List, Mapping, Optional, Tuple

from temperd.sources import procfs
from temperd.sources.changes import (CHANGE_KINDS, EXEC, EXIT, NEW_PROCESS, NEW_THREAD, RENAME, REUSED, UPDATE,
                                     Change, InventoryStats, ReconcileSummary)
from temperd.sources.facts import ProcessFacts, ThreadFacts
from temperd.sources.process_store import InventorySnapshot, ProcessStore, thread_facts
from temperd.sources.proc_connector import Batch, ConnectorUnavailable, ProcConnector, ProcEvent
from temperd.sources.scan import scan
from temperd.sources.title_rechecks import TITLE_RECHECKS_S, TitleRechecks

__all__ = ["CHANGE_KINDS", "EXEC", "EXIT", "NEW_PROCESS", "NEW_THREAD", "RENAME", "REUSED", "UPDATE", "Change",
           "Inventory", "InventoryStats", "ReconcileSummary"]

log = logging.getLogger("temperd.sources.inventory")

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
        self._rechecks = TitleRechecks(self._store, title_rechecks_s)
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
        if self._rechecks.next_due is not None:
            due.append(self._rechecks.next_due)
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
        self._rechecks.run(changes)
        if self._resync_pending and time.monotonic() - self._last_reconcile_at >= self._resync_min_interval_s:
            changes.extend(self._reconcile(notify=False).changes)
        self._notify(changes)
        return changes

    def _apply_batch(self, batch: Batch, changes: List[Change]) -> None:
        if batch.overflowed:
            self._events_lost += 1
            self._resync_pending = True
            log.debug("process events lost (receive buffer overflow); rescanning /proc")
        # A task that execs or ends later in the same batch is read then (or not at all), not at its
        # fork too: under a fork storm most new processes fork and exec within one batch.
        settled = {event.tid: index for index, event in enumerate(batch.events) if event.kind in ("exec", "exit")}
        unread_forks = []
        for index, event in enumerate(batch.events):
            if event.kind == "fork" and settled.get(event.tid, -1) > index:
                self._events_received += 1
                if event.tid == event.pid:
                    unread_forks.append(event.pid)
                continue
            self.apply_event(event, changes)
        for pid in unread_forks:  # read at its exec (if it did not end): its title is rechecked as any new process's
            self._rechecks.schedule(pid)
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
                self._rechecks.schedule(event.pid)
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
        self._store.put_thread(proc, dataclasses.replace(old, comm=comm))
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

    # -- scanning ---------------------------------------------------------------------------

    def reconcile(self) -> ReconcileSummary:
        """Scan /proc and make the store equal to it; returns what changed."""
        return self._reconcile(notify=True)

    def _reconcile(self, notify: bool) -> ReconcileSummary:
        wall0 = time.monotonic()
        cpu0 = time.thread_time()
        changes = scan(self._store)
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

    # -- runtime ----------------------------------------------------------------------------

    def refresh_runtime(self, pids: Iterable[int]) -> None:
        """Read the CPU time of every thread of these processes (for "N busiest" selection)."""
        self._vanished += self._store.refresh_runtime(pids)

    def _notify(self, changes: List[Change]) -> None:
        if not changes:
            return
        for listener in list(self._listeners):
            listener(changes)

