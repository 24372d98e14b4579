"""The daemon's main loop: it waits in poll() for process events, a request from a signal
handler or another thread, or the next deadline (reconcile scan, observation sample, watchdog
ping), then acts under the daemon's lock.

Out of file descriptors (EMFILE, ENFILE: every /proc read needs one), a pass is skipped rather
than the daemon lost: the plan in force stays, requests are kept for the next pass, the loop
retries every STARVED_RETRY_S, and once a pass succeeds it rescans /proc and applies the whole
plan again. A spell's start and end are logged, once in STARVED_LOG_EVERY_S."""

from __future__ import annotations

import gc
import logging
import resource
import select
import signal
import time
import threading
from typing import Any, Dict, List, Optional, Protocol

from temperd.files import OUT_OF_DESCRIPTORS
from temperd.config.daemon_config import DaemonConfig
from temperd.daemon.notify import Notifier
from temperd.sources.inventory import Inventory
from temperd.wakeup import Wakeup

WATCHDOG_DEFAULT_S = 10.0  # where the unit sets no WatchdogSec (systemd then ignores the pings)
STARVED_RETRY_S = 1.0
STARVED_LOG_EVERY_S = 600.0  # a spell that comes and goes is logged once in this long
# After a pass that brought process events, the next events wait: a busy host's events are then
# handled in batches, so what a pass costs whatever its events (the match, the plan, the state
# file, the idle cgroup's tasks file, the poll's wakeup and a pass's cold Python) is paid at most
# about 1 / TREAT_WITHIN_S times a second however fast the host forks, and the rest is what the
# events themselves cost. A process that forks, execs and exits within one batch costs a failed
# open instead of reads of /proc, and an unmatched program's fork, exec and exit come in one batch,
# where its exec is not read at all (sources/events.py's passing_execs). A light stream of events
# is treated within milliseconds: the first event after a quiet spell is handled at once.
# The wait is cut so that an event that came just after a batch was taken is treated within
# TREAT_WITHIN_S: it waits out that pass, the wait and its own pass, so the wait is TREAT_WITHIN_S
# less two passes' wall time (smoothed). On a slow host under a fork storm (passes of 30-40 ms) a
# fixed 50 ms batch left 1-9 % of new threads untreated after 100 ms.
# A wait set by what passes cost (4 times a pass's CPU) made a cheaper pass come more often, not
# cost less: at 20 threads, renames and processes a second (bench/churn.py), 35 passes a second and
# 13.7 % of a core; with a fixed 50 ms batch 18 passes and 6.8 %; with the whole bound about 13.
TREAT_WITHIN_S = 0.08
PASS_COST_SMOOTHING = 0.3  # the weight of the latest pass (smoothed())
# The cyclic garbage collector: what the daemon holds is mostly acyclic (facts, records, layers:
# reference counting frees them), but at the default threshold (700) a fork storm's allocations
# made it run ~30 times a second and take a full pass over every object every few seconds (~36 ms
# each, inside a pass): ~2 % of a core at 200 forks a second. What start-up made is frozen out of
# its passes, and the youngest generation is collected every GC_YOUNG_THRESHOLD allocations.
GC_YOUNG_THRESHOLD = 10_000

log = logging.getLogger("temperd")

STOP = "stop"
RELOAD = "reload"
REPLAN = "replan"


class Requests:
    """What signal handlers and other threads ask of the main loop: the latest trigger per kind
    (STOP, RELOAD, REPLAN), and a byte on a pipe that wakes its poll()."""

    def __init__(self) -> None:
        self._wakeup = Wakeup()
        self._pending: Dict[str, str] = {}  # kind -> trigger ("reload" -> "SIGHUP", ...)

    def fileno(self) -> int:
        return self._wakeup.fileno()

    def ask(self, kind: str, trigger: str) -> None:
        self._pending[kind] = trigger
        self._wakeup.wake()

    def drain(self) -> None:
        self._wakeup.drain()

    def take(self) -> Dict[str, str]:
        pending, self._pending = self._pending, {}
        return pending

    def install_signal_handlers(self) -> None:
        """SIGHUP asks for a reload; SIGTERM and SIGINT for a stop. From the main thread only.

        Python runs a handler on the main thread, between bytecodes; the kernel may hand a
        process's signal to any of its threads, and then the main loop would learn of it only when
        its poll() timed out (up to a watchdog interval). The wakeup fd makes the C-level handler,
        on whichever thread it runs, write to this pipe, so poll() returns at once."""
        signal.set_wakeup_fd(self._wakeup.write_end(), warn_on_full_buffer=False)
        signal.signal(signal.SIGHUP, lambda *_: self.ask(RELOAD, "SIGHUP"))
        signal.signal(signal.SIGTERM, lambda *_: self.ask(STOP, "SIGTERM"))
        signal.signal(signal.SIGINT, lambda *_: self.ask(STOP, "SIGINT"))


class LoopHost(Protocol):
    """What the main loop drives: requests in, events and scans through the inventory, replans,
    reloads and observation samples out."""

    lock: threading.RLock
    inventory: Inventory
    notifier: Notifier
    observe_interval_s: float
    requests: Requests

    @property
    def config(self) -> DaemonConfig:
        ...

    def request(self, kind: str, trigger: str) -> None:
        ...

    def replan(self, trigger: str, changes: Optional[List[Any]] = None) -> None:
        ...

    def reload(self, trigger: str) -> Any:
        ...

    def observe(self) -> None:
        ...

    def replan_if_measured(self) -> None:
        ...


class MainLoop:
    def __init__(self, daemon: "LoopHost"):
        self.daemon = daemon
        now = time.monotonic()
        with daemon.lock:
            self.next_reconcile = now + daemon.config.scan_interval(daemon.inventory.events_active)
        self.next_observe = now + min(1.0, daemon.observe_interval_s)
        self.next_watchdog = now
        self.watchdog_every = daemon.notifier.watchdog_interval_s or WATCHDOG_DEFAULT_S
        self.skipped = 0  # passes skipped in the current spell without file descriptors
        self._carried: Dict[str, str] = {}  # requests of a skipped pass
        self._starved_logged_at: Optional[float] = None
        self._recovered_logged_at: Optional[float] = None
        self.events_not_before = 0.0  # monotonic time; see TREAT_WITHIN_S
        self.pass_wall_s: Optional[float] = None  # how long a pass with events takes, smoothed

    def run(self) -> None:
        """Until a STOP request."""
        daemon = self.daemon
        settle_garbage_collector()
        while True:
            with daemon.lock:
                fds, timeout = self._what_to_wait_for()
            ready = _wait(fds, timeout)
            if daemon.requests.fileno() in ready:
                daemon.requests.drain()
            with daemon.lock:
                now = self._pass()
            if now is None:
                return
            if now >= self.next_watchdog:
                daemon.notifier.notify("WATCHDOG=1")
                self.next_watchdog = now + self.watchdog_every

    def _what_to_wait_for(self):
        inventory = self.daemon.inventory
        if self.skipped:  # retry soon, but do not spin on process events that cannot be read
            return [self.daemon.requests.fileno()], STARVED_RETRY_S
        now = time.monotonic()
        timeout = max(0.0, min(self.next_reconcile, self.next_observe, self.next_watchdog) - now)
        fds: List[int] = [self.daemon.requests.fileno()]
        if inventory.events_active and now < self.events_not_before:
            # Events and the inventory's own deadlines (title rechecks) wait for the next batch;
            # neither is polled until then, so nothing due-but-deferred wakes the loop.
            return fds, min(timeout, self.events_not_before - now)
        inventory_timeout = inventory.poll_timeout()
        if inventory_timeout is not None:
            timeout = min(timeout, inventory_timeout)
        if inventory.events_active:
            fds.append(inventory.fileno())
        return fds, timeout

    def _pass(self) -> Optional[float]:
        """One _step; a pass without file descriptors is skipped (see the module's docstring)."""
        try:
            now = self._step()
        except OSError as exc:
            if exc.errno not in OUT_OF_DESCRIPTORS:
                raise
            self._starved(exc)
            return time.monotonic()
        if self.skipped and now is not None:
            if _due(self._recovered_logged_at, now):
                self._recovered_logged_at = now
                log.warning("file descriptors available again after %d skipped pass(es): rescanning /proc and "
                            "applying the whole plan", self.skipped)
            self.skipped = 0
            self.next_reconcile = now  # events may have been lost
            self.daemon.request(REPLAN, "file descriptors available again")
        return now

    def _starved(self, exc: OSError) -> None:
        self.skipped += 1
        now = time.monotonic()
        if self.skipped == 1 and _due(self._starved_logged_at, now):
            self._starved_logged_at = now
            soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            log.error("out of file descriptors (%s; the limit is %d): this pass is skipped, the plan in force "
                      "stays, retrying every %g s", exc.strerror, soft, STARVED_RETRY_S)

    def _step(self) -> Optional[float]:
        """Process events and requests, then whatever is due. The time it finished; None: stop."""
        daemon, inventory = self.daemon, self.daemon.inventory
        pending = self._carried
        pending.update(daemon.requests.take())
        self._carried = {}
        if STOP in pending:
            return None
        try:
            changes = []
            wall_before, cpu_before = time.monotonic(), time.thread_time()
            received = inventory.events_received
            if inventory.events_active and time.monotonic() >= self.events_not_before:
                changes = inventory.handle_events()
            # Events that changed nothing (processes no profile can match) are batched too.
            handled = bool(changes) or inventory.events_received != received
            if RELOAD in pending:
                daemon.reload(pending[RELOAD])
            elif REPLAN in pending:
                daemon.replan(pending[REPLAN])  # a whole apply: the backend's situation changed
            elif changes:
                daemon.replan("events", changes)
            if handled:
                ended = time.monotonic()
                self.pass_wall_s = smoothed(self.pass_wall_s, ended - wall_before)
                self.events_not_before = ended + batch_wait(self.pass_wall_s)
                daemon.event_passes += 1
                daemon.event_cpu_s += time.thread_time() - cpu_before
        except OSError:
            self._carried = pending  # asked again on the next pass
            raise
        now = time.monotonic()
        if now >= self.next_reconcile or inventory.needs_reconcile:
            summary = inventory.reconcile()
            self.next_reconcile = now + daemon.config.scan_interval(inventory.events_active)
            if summary.changes:
                daemon.replan("reconcile")
        if now >= self.next_observe:
            daemon.observe()
            daemon.replan_if_measured()
            self.next_observe = now + daemon.observe_interval_s
        return now


def settle_garbage_collector() -> None:
    """Start-up's objects out of the collector's passes, and young collections less often (GC_YOUNG_THRESHOLD)."""
    gc.freeze()
    _young, middle, old = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, middle, old)


def smoothed(before: Optional[float], now: float) -> float:
    """How long a pass takes, smoothed over the last few: one slow pass does not cut a whole batch."""
    return now if before is None else PASS_COST_SMOOTHING * now + (1 - PASS_COST_SMOOTHING) * before


def batch_wait(pass_wall_s: float = 0.0) -> float:
    """How long the next process events wait after a pass with events that took this long (smoothed)."""
    return max(0.0, TREAT_WITHIN_S - 2 * pass_wall_s)


def _due(last: Optional[float], now: float) -> bool:
    return last is None or now - last >= STARVED_LOG_EVERY_S


def _wait(fds: List[int], timeout: float) -> List[int]:
    """The fds that became readable within timeout seconds. poll(), not select(): any fd number
    (the unit allows more than FD_SETSIZE), and no descriptor of its own as epoll would need."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    try:
        return [fd for fd, _events in poller.poll(timeout * 1000)]
    except InterruptedError:
        return []
