"""scx_layered's process through its states (status.py names them), one tick at a time: start it
when a config is asked for and sched_ext is free, count it attached once its stats socket
answers, restart it for a plan change when that is due, and judge each exit: asked for, stopped
from outside, or a crash (backoff, then safe mode past crash_limit).

Ticks come from one thread at a time (the supervisor's); the lock guards what status() and the
other readers see from other threads."""

from __future__ import annotations

import logging
import os
import subprocess
import threading
import time
from typing import Callable, Dict, Mapping, Optional, Sequence, Tuple

from temperd.backends.scx.detect import SchedExtGate, binary_trust_problem
from temperd.backends.scx.process import STOPPED_BY_SIGNAL, exit_reason, keep_crash_log, spawn, terminate
from temperd.backends.scx.restarts import CrashHistory, DefaultSchedulerGap, PlanChanges, RestartPolicy, ScxRun
from temperd.backends.scx.stats import StatsReader
from temperd.backends.scx.status import BACKOFF, IDLE, REFUSED, RUNNING, SAFE_MODE, STARTING, STOPPED
from temperd.control.status import ExitView, GapView, SupervisorView
from temperd.files import write_atomically

# One logger for scx_layered's starts, exits and safe mode, whichever part of the supervisor writes.
log = logging.getLogger("temperd.backends.scx.supervisor")

CONFIG_FILE = "scx_layered.json"
LOG_FILE = "scx_layered.log"
CRASH_LOG_FILE = "scx_layered.crash.log"
# SupervisorView's counts kept here; the stats reader and the plan changes keep the others.
_OWN_COUNTERS = ("starts", "restarts", "crash_restarts", "crashes", "outside_stops", "refusals", "safe_mode_entries")


class ScxLifecycle:
    """scx_layered's process and its restart state machine: tick() moves it on, status() reports it."""

    def __init__(self, binary: str, args: Sequence[str], env: Mapping[str, str], state_dir: str,
                 stats_socket_path: str, sysfs_root: str, policy: RestartPolicy, clock: Callable[[], float],
                 on_safe_mode: Callable[[str], None], on_attach: Callable[[bool], None]):
        self.binary = binary
        self.args = tuple(args)
        self.env = env
        self.state_dir = state_dir
        self.config_path = os.path.join(state_dir, CONFIG_FILE)
        self.log_path = os.path.join(state_dir, LOG_FILE)
        self.stats_socket_path = stats_socket_path
        self.policy = policy
        self.clock = clock
        self.on_safe_mode = on_safe_mode
        self.on_attach = on_attach  # True: it attached; False: an attached one exited

        self._lock = threading.Lock()  # guards everything below against readers on other threads
        self.state = IDLE
        self._changes = PlanChanges(policy)
        self._proc: Optional[subprocess.Popen] = None
        self._started_at: Optional[float] = None
        self._attach_deadline = 0.0
        self._next_start_at = 0.0
        self._gate = SchedExtGate(sysfs_root, policy.busy_grace_s)
        self._gap = DefaultSchedulerGap()
        self._crashes = CrashHistory(policy)
        self._after_crash = False
        self.safe_reason: Optional[str] = None
        self._last_exit: Optional[ExitView] = None
        self.stats = StatsReader(stats_socket_path, policy.stats_timeout_s, policy.stats_interval_s, clock)
        self.counters: Dict[str, int] = dict.fromkeys(_OWN_COUNTERS, 0)

    @property
    def pid(self) -> Optional[int]:
        proc = self._proc
        return proc.pid if proc is not None else None

    def ask(self, run: ScxRun) -> bool:
        """Run this config with these options; True when it differs from what runs or waits."""
        with self._lock:
            return self._changes.ask(run, self._proc is not None, self.clock())

    def stop_process(self) -> None:
        """Stop scx_layered as asked (SIGTERM, SIGKILL after stop_timeout_s); a later tick may start it."""
        self._terminate(requested=True)

    def stop(self) -> Optional[ExitView]:
        """Stop scx_layered and start it no more; its last exit."""
        self._terminate(requested=True)
        with self._lock:
            self.state = STOPPED
            return self._last_exit

    def clear_safe_mode(self) -> None:
        with self._lock:
            self._crashes.clear()
            self.safe_reason = None
            self._next_start_at = 0.0
            if self.state in (SAFE_MODE, REFUSED, STOPPED):
                self.state = IDLE

    def status(self) -> SupervisorView:
        with self._lock:
            now = self.clock()
            pending = self._changes.pending
            due = self._changes.restart_due(self._started_at) if pending else 0.0
            return SupervisorView(
                state=self.state,
                pid=self.pid,
                binary=self.binary,
                args=self.args + self._options(self._changes.running),
                config_path=self.config_path,
                log_path=self.log_path,
                stats_socket=self.stats_socket_path,
                uptime_s=round(now - self._started_at, 3) if self._started_at is not None and self._proc else None,
                pending_change=pending,
                next_restart_in_s=round(max(0.0, due - now), 3) if pending else None,
                safe_mode=self.safe_reason is not None,
                safe_mode_reason=self.safe_reason,
                crashes_in_window=len(self._crashes),
                last_exit=self._last_exit,
                default_scheduler_gap_s=GapView(self._gap.last_s, round(self._gap.total_s, 3)),
                coalesced_changes=self._changes.coalesced,
                **self.stats.report(),
                **self.counters,
            )

    # ---- the state machine -----------------------------------------------------------------------

    def tick(self) -> None:
        if self.state in (SAFE_MODE, REFUSED, STOPPED):
            return
        proc = self._proc
        if proc is not None and proc.poll() is not None:
            self._on_exit(proc.returncode, requested=False)
        if self.state in (SAFE_MODE, REFUSED):
            return
        if self._proc is None:
            if self._changes.desired is not None and self.clock() >= self._next_start_at:
                self._start()
        elif self._changes.pending and self.clock() >= self._changes.restart_due(self._started_at):
            self._terminate(requested=True)
            with self._lock:
                self.counters["restarts"] += 1
            self._start()
        if self._proc is not None:
            if self.state == STARTING:
                self._check_attached()
            if self.state == RUNNING:
                self.stats.poll()

    def _start(self) -> None:
        now = self.clock()
        reason, wait = self._gate.check(now)
        if wait:
            self._next_start_at = now + min(0.5, self.policy.busy_grace_s)
            return
        if reason is not None:
            with self._lock:
                self.counters["refusals"] += 1
            self._enter_safe_mode(REFUSED, f"refusing to start scx_layered: {reason}")
            return
        untrusted = binary_trust_problem(self.binary)
        if untrusted:  # checked at each start: the file may have changed since the last one
            self._enter_safe_mode(SAFE_MODE, f"refusing to run scx_layered: {untrusted}")
            return
        with self._lock:
            run = self._changes.desired
        assert isinstance(run, ScxRun)
        os.makedirs(self.state_dir, exist_ok=True)
        write_atomically(self.config_path, run.config)
        argv = [self.binary, *self.args, *self._options(run), f"f:{self.config_path}"]
        try:
            proc = spawn(argv, self.log_path, self.env)
        except OSError as exc:
            self._enter_safe_mode(SAFE_MODE, f"cannot run {self.binary}: {exc}")
            return
        log.info("started %s (pid %d)", " ".join(argv), proc.pid)
        with self._lock:
            self._proc = proc
            self._changes.started(run, now)
            self._started_at = now
            self._attach_deadline = now + self.policy.attach_timeout_s
            self.state = STARTING
            self.counters["starts"] += 1
            if self._after_crash:
                self.counters["crash_restarts"] += 1
            self._after_crash = False

    def _options(self, run: Optional[ScxRun]) -> Tuple[str, ...]:
        """The options a run adds to [scx] args (those not given there already)."""
        return tuple(o for o in run.options if o not in self.args) if run is not None else ()

    def _check_attached(self) -> None:
        if not self.stats.attach():
            if self.clock() > self._attach_deadline:
                log.warning("scx_layered did not attach within %.0f s", self.policy.attach_timeout_s)
                self._terminate(requested=False,
                                reason=f"did not attach (stats socket {self.stats_socket_path} silent) "
                                       f"within {self.policy.attach_timeout_s:g} s")
            return
        now = self.clock()
        with self._lock:
            self.state = RUNNING
            self._gap.end(now)
        log.info("scx_layered attached (pid %d)", self.pid or -1)
        self.on_attach(True)

    def _terminate(self, requested: bool, reason: Optional[str] = None) -> None:
        proc = self._proc
        if proc is not None:
            self._on_exit(terminate(proc, self.policy.stop_timeout_s), requested=requested, reason=reason)

    def _on_exit(self, code: int, requested: bool, reason: Optional[str] = None) -> None:
        self.stats.detach()
        now = self.clock()
        signalled_by_us = reason is not None  # _terminate with a reason: we stopped one that failed to attach
        reason = reason or exit_reason(self.log_path, code)
        record = ExitView(code, requested, reason, time.time())
        with self._lock:
            self._proc = None
            self._gate.exited(now)
            self._last_exit = record
            was_attached = self.state == RUNNING
            if was_attached:  # an exit before attaching leaves the gap that began earlier
                self._gap.begin(now)
            self.state = IDLE
        if was_attached:
            self.on_attach(False)
        if requested:
            log.info("scx_layered stopped: %s", reason)
            return
        if code in STOPPED_BY_SIGNAL and not signalled_by_us:
            # Stopped from outside, not crashed: `systemctl stop temperd` signals every process of
            # the unit at once (KillMode=control-group), so scx_layered may be gone before temperd's
            # own stop reaches the supervisor; or an administrator stopped it. Not a crash (no safe
            # mode for a clean stop): it is started again after the first backoff, unless temperd
            # is stopping meanwhile.
            log.warning("scx_layered was stopped from outside temperd: %s", reason)
            with self._lock:
                self.counters["outside_stops"] += 1
                self._next_start_at = now + self.policy.crash_backoff_s
                self.state = BACKOFF
            return
        log.warning("scx_layered exited unexpectedly: %s", reason)
        keep_crash_log(self.log_path, os.path.join(self.state_dir, CRASH_LOG_FILE))
        with self._lock:
            self.counters["crashes"] += 1
            crashes = self._crashes.record(now)
            self._after_crash = True
        if crashes >= self.policy.crash_limit:
            self._enter_safe_mode(SAFE_MODE, f"scx_layered exited {crashes} times within "
                                             f"{self.policy.crash_window_s:g} s (last: {reason}); "
                                             "the native backend carries the plan")
            return
        with self._lock:
            self._next_start_at = now + self._crashes.backoff_s(crashes)
            self.state = BACKOFF

    def _enter_safe_mode(self, state: str, reason: str) -> None:
        with self._lock:
            self.state = state
            self.safe_reason = reason
            self.counters["safe_mode_entries"] += 1
        log.error("scx backend: %s", reason)
        self.on_safe_mode(reason)
