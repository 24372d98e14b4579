"""The daemon's main loop: it waits in select() for process events, a request from a signal
handler or another thread, or the next deadline (reconcile scan, observation sample, watchdog
ping), then acts under the daemon's lock."""

from __future__ import annotations

import os
import select
import time
from typing import TYPE_CHECKING, Dict, List, Optional

if TYPE_CHECKING:
    from temperd.daemon.daemon import Daemon

WATCHDOG_DEFAULT_S = 10.0  # where the unit sets no WatchdogSec (systemd then ignores the pings)

STOP = "stop"
RELOAD = "reload"
REPLAN = "replan"


class Requests:
    """What signal handlers and other threads ask of the main loop: the latest trigger per kind
    (STOP, RELOAD, REPLAN), and a byte on a pipe that wakes its select()."""

    def __init__(self) -> None:
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._pending: Dict[str, str] = {}  # kind -> trigger ("reload" -> "SIGHUP", ...)

    def fileno(self) -> int:
        return self._wake_r

    def ask(self, kind: str, trigger: str) -> None:
        self._pending[kind] = trigger
        try:
            os.write(self._wake_w, b"x")
        except BlockingIOError:
            pass  # the pipe is full: the loop wakes anyway

    def drain(self) -> None:
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass

    def take(self) -> Dict[str, str]:
        pending, self._pending = self._pending, {}
        return pending


class MainLoop:
    def __init__(self, daemon: "Daemon"):
        self.daemon = daemon
        now = time.monotonic()
        with daemon.lock:
            self.next_reconcile = now + daemon.config.scan_interval(daemon.inventory.events_active)
        self.next_observe = now + min(1.0, daemon.observe_interval_s)
        self.next_watchdog = now
        self.watchdog_every = daemon.notifier.watchdog_interval_s or WATCHDOG_DEFAULT_S

    def run(self) -> None:
        """Until a STOP request."""
        daemon = self.daemon
        while True:
            with daemon.lock:
                fds, timeout = self._what_to_wait_for()
            try:
                ready, _, _ = select.select(fds, [], [], timeout)
            except InterruptedError:
                ready = []
            if daemon.requests.fileno() in ready:
                daemon.requests.drain()
            with daemon.lock:
                now = self._step()
            if now is None:
                return
            if now >= self.next_watchdog:
                daemon.notifier.notify("WATCHDOG=1")
                self.next_watchdog = now + self.watchdog_every

    def _what_to_wait_for(self):
        inventory = self.daemon.inventory
        timeout = max(0.0, min(self.next_reconcile, self.next_observe, self.next_watchdog) - time.monotonic())
        inventory_timeout = inventory.poll_timeout()
        if inventory_timeout is not None:
            timeout = min(timeout, inventory_timeout)
        fds: List[int] = [self.daemon.requests.fileno()] + ([inventory.fileno()] if inventory.events_active else [])
        return fds, timeout

    def _step(self) -> Optional[float]:
        """Process events and requests, then whatever is due. The time it finished; None: stop."""
        daemon, inventory = self.daemon, self.daemon.inventory
        changes = inventory.handle_events() if inventory.events_active else []
        pending = daemon.requests.take()
        if STOP in pending:
            return None
        if RELOAD in pending:
            daemon.reload(pending[RELOAD])
        elif REPLAN in pending:
            daemon.replan(pending[REPLAN])  # a whole apply: the backend's situation changed
        elif changes:
            daemon.replan("events", changes)
        now = time.monotonic()
        if now >= self.next_reconcile or inventory.needs_reconcile:
            summary = inventory.reconcile()
            self.next_reconcile = now + daemon.config.scan_interval(inventory.events_active)
            if summary.changes:
                daemon.replan("reconcile")
        if now >= self.next_observe:
            daemon.observe()
            self.next_observe = now + daemon.observe_interval_s
        return now
