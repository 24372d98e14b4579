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

import logging
import time
from typing import Callable, FrozenSet, Iterable, List, Mapping, Optional, Tuple

from temperd.control.status import InventoryView
from temperd.sources import procfs
from temperd.sources.changes import Change, ReconcileSummary
from temperd.sources.facts import ProcessFacts, ThreadFacts
from temperd.sources.process_store import InventorySnapshot, ProcessRecord, ProcessStore
from temperd.sources.proc_connector import Batch, ConnectorUnavailable, ProcConnector, ProcEvent
from temperd.sources.events import EventApplier, passing_execs
from temperd.sources.light import Gate
from temperd.sources.scan import scan
from temperd.sources.tracking import Tracker
from temperd.sources.title_rechecks import TITLE_RECHECKS_S, TitleRechecks

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
        self._tracker = Tracker(self._store)
        self._applier = EventApplier(self._store, self._tracker, self._rechecks)
        self._resync_pending = False
        self._last_reconcile_at = float("-inf")
        self._notice_logged = False
        self._events_received = 0
        self._events_lost = 0
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

    def set_gate(self, gate: Gate) -> None:
        """Which processes to track from now on (decide/candidates.py's index, made at each reload
        and runtime binding). Untracked processes are looked at again under it (those it wants are
        read whole); tracked ones stay tracked. No change is reported: the caller applies the
        whole plan next."""
        self._tracker.gate = gate
        for pid in sorted(self._store.light):  # parents mostly first: a wanted parent brings its children
            if pid not in self._store.light:
                continue
            stat = procfs.read_task_stat(pid, pid)
            if stat is None:
                self._store.drop_light(pid)
                continue
            proc = self._tracker.read_new(pid, stat)
            if isinstance(proc, ProcessRecord):
                self._store.install(proc)

    @property
    def events_received(self) -> int:
        return self._events_received

    @property
    def gate(self) -> Gate:
        return self._tracker.gate

    # -- queries ----------------------------------------------------------------------------

    @property
    def processes(self) -> Mapping[int, ProcessFacts]:
        return self._store.snapshot().processes

    def process(self, pid: int) -> Optional[ProcessFacts]:
        """A process's facts; an untracked one's read whole now (explain, bind), not kept."""
        if pid in self._store.light:
            proc = self._store.read_process(pid)
            return proc.freeze() if proc is not None else None
        return self._store.process(pid)

    def thread(self, tid: int) -> Optional[ThreadFacts]:
        return self._store.thread(tid)

    def snapshot(self) -> InventorySnapshot:
        return self._store.snapshot()

    def changed_since(self, generation: Optional[int]) -> Optional[FrozenSet[int]]:
        """The pids whose facts the latest snapshot made again since the snapshot of `generation`;
        None where it cannot say (the matcher then compares every process)."""
        return self._store.changed_since(generation)

    @property
    def stats(self) -> InventoryView:
        return InventoryView(
            events_active=self.events_active,
            events_received=self._events_received,
            events_lost=self._events_lost,
            vanished=self._applier.vanished,
            reconciles=self._reconciles,
            last_reconcile_duration_s=self._last_duration_s,
            last_reconcile_cpu_s=self._last_cpu_s,
            processes=len(self._store.procs),
            threads=len(self._store.tid_pid),
            untracked=len(self._store.light),
            untracked_seen=self._tracker.kept_light,
            bounded=self._tracker.bounds.refused,
            event_filter=self._connector.filter if self._connector is not None else "no process events",
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
        events = batch.events
        untrusted = self._tracker.bounds.owner_of
        if untrusted:  # trusted owners' events first: an untrusted flood waits behind them
            events = [e for e in events if e.pid not in untrusted] + [e for e in events if e.pid in untrusted]
        # A task that execs or ends later in the same batch is read then (or not at all), not at its
        # fork too: under a fork storm most new processes fork and exec within one batch.
        settled = {event.tid: index for index, event in enumerate(events) if event.kind in ("exec", "exit")}
        passing = passing_execs(events, self._store.procs, self._tracker.gate.bound) if self._tracker.selective else ()
        unread_forks = []
        for index, event in enumerate(events):
            if event.kind == "fork" and settled.get(event.tid, -1) > index:
                self._events_received += 1
                if event.tid == event.pid:
                    unread_forks.append(event.pid)
                continue
            if event.kind == "exec" and event.pid in passing:  # gone before its read: counted so
                self._events_received += 1
                self._applier.vanished += 1
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
        self._applier.apply(event, changes)

    # -- scanning ---------------------------------------------------------------------------

    def reconcile(self) -> ReconcileSummary:
        """Scan /proc and make the store equal to it; returns what changed."""
        return self._reconcile(notify=True)

    def _reconcile(self, notify: bool) -> ReconcileSummary:
        wall0 = time.monotonic()
        cpu0 = time.thread_time()
        changes = scan(self._store, self._tracker)
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
        self._applier.vanished += self._store.refresh_runtime(pids)

    def _notify(self, changes: List[Change]) -> None:
        if not changes:
            return
        for listener in list(self._listeners):
            listener(changes)
