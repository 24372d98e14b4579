"""The daemon's main loop: it waits in poll() for process events, a request from a signal
handler or another thread, or the next deadline (reconcile scan, observation sample, watchdog
ping), then acts under the daemon's lock.

Out of file descriptors (EMFILE, ENFILE: every /proc read needs one), a pass is skipped rather
than the daemon lost: the plan in force stays, requests are kept for the next pass, the loop
retries every STARVED_RETRY_S, and once a pass succeeds it rescans /proc and applies the whole
plan again. A spell's start and end are logged, once in STARVED_LOG_EVERY_S."""

from __future__ import annotations

import errno
import gc
import logging
import resource
import select
import signal
import time
import threading
from typing import Any, Dict, List, Optional, Protocol, Tuple

from temperd.config.daemon_config import DaemonConfig
from temperd.daemon.notify import Notifier
from temperd.sources.inventory import Inventory
from temperd.wakeup import Wakeup

WATCHDOG_DEFAULT_S = 10.0  # where the unit sets no WatchdogSec (systemd then ignores the pings)
STARVED_RETRY_S = 1.0
OUT_OF_DESCRIPTORS = (errno.EMFILE, errno.ENFILE)
STARVED_LOG_EVERY_S = 600.0  # a spell that comes and goes is logged once in this long
# After a pass that brought process events, the next events wait: a busy host's events are then
# handled in batches (one match and plan per batch, not per fork), and a process that forks, execs
# and exits within one costs a failed open instead of reads of /proc. The wait is
# BATCH_WAIT_PER_CPU times the CPU time such passes took (smoothed()), at most EVENT_BATCH_S:
# under a steady stream of events a cycle is a pass and its wait, so handling events takes at most
# EVENT_PATH_SHARE of a core until batches reach EVENT_BATCH_S, however fast the host forks; below
# those caps a cheaper pass buys shorter cycles (less delay), not less CPU. A light stream of events is treated
# within milliseconds, and the first event after a quiet spell is handled at once. A pass's cost is
# the whole daemon's CPU over its cycle (cycle_cost()): the idle cgroup's moves are made on a worker
# thread (cgroup_moves.py), beside the main loop.
# The wait is also cut so that an event that came just after a batch was taken is treated within
# TREAT_WITHIN_S: it waits out that pass, the wait and its own pass, so the wait is at most
# TREAT_WITHIN_S less two passes' wall time (smoothed). On a slow host under a fork storm (passes of
# 30-40 ms) the 50 ms batch left 1-9 % of new threads untreated after 100 ms. Where this cut binds,
# passes come more often than EVENT_PATH_SHARE allows (back-to-back passes of 40 ms at worst).
# A fifth of a core, not a quarter. At 200 threads, renames and processes a second (bench/churn.py)
# on a 2-vCPU guest, passes cost 12-18 ms and the cut above binds as often as the share: the fifth
# measured 22.5-24.9 % of a core there against the quarter's 24.4-27.2 %, with 99.6-100 % treated
# within 100 ms in both. A cheaper pass is what lowers it further.
EVENT_PATH_SHARE = 0.2
EVENT_BATCH_S = 0.05
BATCH_WAIT_PER_CPU = 1.0 / EVENT_PATH_SHARE - 1.0  # a pass of c seconds, then a wait of 4c
TREAT_WITHIN_S = 0.08
# After a pass whose events changed nothing (processes no profile can match: forks, execs and
# exits of light processes), the next events wait at least QUIET_BATCH_S (under the cut above): a
# short-lived unmatched program's fork, exec and exit then come in one batch, where its exec is not
# read at all (sources/events.py's passing_execs), instead of a wakeup and a pass each.
QUIET_BATCH_S = EVENT_BATCH_S
CYCLE_S = 1.0  # a pass with events this soon after the last one ended is part of a stream (cycle_cost())
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

    @property
    def requests(self) -> "Requests":
        ...

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
        self.events_not_before = 0.0  # monotonic time; see EVENT_BATCH_S
        self.pass_cpu_s: Optional[float] = None  # what a pass with events costs, smoothed
        self.pass_wall_s: Optional[float] = None  # and how long it takes, smoothed
        self._last_batch_end: Optional[Tuple[float, float]] = None  # (process CPU, monotonic time): see cycle_cost()

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
            cpu_before, wall_before = time.thread_time(), time.monotonic()
            received = inventory.events_received
            if inventory.events_active and time.monotonic() >= self.events_not_before:
                changes = inventory.handle_events()
            # Events that changed nothing (processes no profile can match) are batched too: a pass
            # per exec of an unmatched loop would cost more than reading it.
            handled = bool(changes) or inventory.events_received != received
            if RELOAD in pending:
                daemon.reload(pending[RELOAD])
            elif REPLAN in pending:
                daemon.replan(pending[REPLAN])  # a whole apply: the backend's situation changed
            elif changes:
                daemon.replan("events", changes)
            if handled:
                ended = (time.process_time(), time.monotonic())
                cost = cycle_cost(self._last_batch_end, ended, time.thread_time() - cpu_before)
                self._last_batch_end = ended
                self.pass_cpu_s = smoothed(self.pass_cpu_s, cost)
                self.pass_wall_s = smoothed(self.pass_wall_s, ended[1] - wall_before)
                self.events_not_before = time.monotonic() + batch_wait(self.pass_cpu_s, self.pass_wall_s,
                                                                       quiet=not changes)
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
    """A pass's cost, smoothed over the last few: under a steady stream the wait settles, rather
    than a dear pass's long wait and a cheap pass's short one taking turns (half the passes then
    paid the per-pass costs for a handful of events)."""
    return now if before is None else PASS_COST_SMOOTHING * now + (1 - PASS_COST_SMOOTHING) * before


def cycle_cost(last_end: Optional[Tuple[float, float]], end: Tuple[float, float], pass_thread_cpu_s: float) -> float:
    """The cost of a pass with events, which the next batch's wait follows: within a stream of
    events (the last such pass ended less than CYCLE_S ago), the process's CPU since that pass
    ended: this pass and what other threads did meanwhile, the moves of the last batch among them.
    Else (the first pass after a quiet spell) this pass's own CPU on the main thread. last_end,
    end: (process CPU, monotonic time) at the end of the last such pass and of this one."""
    if last_end is not None and end[1] - last_end[1] < CYCLE_S:
        return max(0.0, end[0] - last_end[0])
    return pass_thread_cpu_s


def batch_wait(pass_cpu_s: float, pass_wall_s: float = 0.0, quiet: bool = False) -> float:
    """How long the next process events wait after a pass with events that took this much CPU
    and this long (both smoothed); quiet: its events changed nothing (QUIET_BATCH_S)."""
    wait = min(EVENT_BATCH_S, BATCH_WAIT_PER_CPU * pass_cpu_s)
    if quiet:
        wait = max(wait, QUIET_BATCH_S)
    return max(0.0, min(wait, TREAT_WITHIN_S - 2 * pass_wall_s))


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
