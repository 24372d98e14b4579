"""Run scx_layered with the rendered configuration and keep it honest.

- Start: refuse when another sched_ext scheduler holds the kernel (named from
  /sys/kernel/sched_ext/root/ops); write the config atomically under the state directory; run
  `scx_layered [ARGS] f:<file>` with its output in `scx_layered.log` (scx/process.py); it
  counts as attached once its stats socket answers. The child dies with the thread that
  started it, so start the supervisor from a thread that lives as long as it (start() runs
  its own).
- Stats: one connection to the stats socket, kept open (scx_layered reports deltas since the
  previous request on the same connection), read every stats_interval_s (scx/stats.py).
- What it reports: scx/status.py.
- Plan changes: scx_layered has no reload, so a new config means stop + start, and every
  restart leaves the host on the kernel's default scheduler for a moment. Changes are batched
  (batch_s after the first one) and restarts rate-limited (min_interval_s apart); restarts,
  coalesced changes and the time spent on the default scheduler are counted.
- Exits: an exit temperd did not ask for is a crash (unless it is the clean exit of a
  scx_layered told to stop by someone else, e.g. systemd's SIGTERM to the whole unit); the next
  start waits a doubling backoff.
  crash_limit crashes within crash_window_s put the supervisor into safe mode: it stops
  starting scx_layered and reports why, so the daemon can carry the plan out natively.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import threading
import time
from typing import Callable, Dict, List, Mapping, Optional, Sequence

from temperd.backends.scx.detect import binary_trust_problem, start_blocker
from temperd.backends.scx.process import STOPPED_BY_SIGNAL, exit_reason, keep_crash_log, spawn, terminate
from temperd.backends.scx.restarts import CrashHistory, RestartPolicy
from temperd.backends.scx.stats import StatsReader, SysStats
from temperd.backends.scx.status import (BACKOFF, COUNTERS, IDLE, REFUSED, RUNNING, SAFE_MODE, STARTING, STOPPED,
                                         ExitRecord, SupervisorStatus)
from temperd.backends.scx.validate import errors_of, validate_config
from temperd.config.daemon_config import ScxSettings
from temperd.files import write_atomically

log = logging.getLogger(__name__)

DEFAULT_STATS_SOCKET = ScxSettings().stats_socket
CONFIG_FILE = "scx_layered.json"
LOG_FILE = "scx_layered.log"
CRASH_LOG_FILE = "scx_layered.crash.log"
_OWN_COUNTERS = tuple(c for c in COUNTERS if c not in ("stats_reads", "stats_errors"))  # those are the reader's


class ScxConfigError(ValueError):
    def __init__(self, problems: Sequence[str]):
        self.problems = tuple(problems)
        super().__init__("scx_layered config rejected: " + "; ".join(self.problems))


class ScxSupervisor:
    def __init__(self, binary: str, state_dir: str, stats_socket_path: str = DEFAULT_STATS_SOCKET, *,
                 sysfs_root: str = "/sys", clock: Callable[[], float] = time.monotonic,
                 policy: RestartPolicy = RestartPolicy(), args: Sequence[str] = (),
                 env: Optional[Mapping[str, str]] = None, cpu_count: Optional[int] = None,
                 gpu_support: bool = False, on_safe_mode: Optional[Callable[[str], None]] = None):
        self.binary = binary
        self.state_dir = state_dir
        self.stats_socket_path = stats_socket_path
        self.sysfs_root = sysfs_root
        self.clock = clock
        self.policy = policy
        self.args = tuple(args) + (("--enable-gpu-support",) if gpu_support and "--enable-gpu-support" not in args else ())
        self.env = dict(env) if env is not None else None
        self.cpu_count = cpu_count
        self.gpu_support = gpu_support
        self.on_safe_mode = on_safe_mode
        self.config_path = os.path.join(state_dir, CONFIG_FILE)
        self.log_path = os.path.join(state_dir, LOG_FILE)

        self._lock = threading.Lock()  # guards everything below against readers on other threads
        self._tick_lock = threading.Lock()  # one tick at a time
        self._state = IDLE
        self._desired: Optional[str] = None  # canonical JSON of the config to run
        self._running: Optional[str] = None  # ... and of the one the process runs
        self._pending_since: Optional[float] = None
        self._proc: Optional[subprocess.Popen] = None
        self._started_at: Optional[float] = None
        self._attach_deadline = 0.0
        self._next_start_at = 0.0
        self._busy_since: Optional[float] = None
        self._exited_at: Optional[float] = None  # clock() of the last exit of our process
        self._gap_since: Optional[float] = None  # when the host went back to the default scheduler
        self._crashes = CrashHistory(policy)
        self._after_crash = False
        self._safe_reason: Optional[str] = None
        self._last_exit: Optional[ExitRecord] = None
        self._stats = StatsReader(stats_socket_path, policy.stats_timeout_s, policy.stats_interval_s, clock)
        self.counters: Dict[str, int] = dict.fromkeys(_OWN_COUNTERS, 0)
        self._gap_last_s: Optional[float] = None
        self._gap_total_s = 0.0
        self._thread: Optional[threading.Thread] = None
        self._stopping = threading.Event()

    # ---- what the daemon calls -------------------------------------------------------------------

    def apply(self, config: List[dict]) -> bool:
        """Ask for this config. Returns True when it differs from what is running or pending.

        The restart happens in tick(), batched and rate-limited. Raises ScxConfigError for a
        config the validator rejects (the running one stays)."""
        problems = errors_of(validate_config(config, cpu_count=self.cpu_count, gpu_support=self.gpu_support))
        if problems:
            raise ScxConfigError([f"{p.path}: {p.message} [{p.rule}]" for p in problems])
        text = json.dumps(config, indent=2, sort_keys=True) + "\n"
        with self._lock:
            if text == self._desired:
                return False
            if self._pending_since is not None:
                self.counters["coalesced_changes"] += 1
            self._desired = text
            if text == self._running:
                self._pending_since = None  # back to what runs: nothing to do
                return False
            if self._proc is not None and self._pending_since is None:
                self._pending_since = self.clock()
            return True

    def start(self) -> None:
        """Run tick() on a thread of its own until stop()."""
        if self._thread is not None:
            return
        self._stopping.clear()
        self._thread = threading.Thread(target=self._loop, name="scx-supervisor", daemon=True)
        self._thread.start()

    def stop(self) -> Optional[int]:
        """SIGTERM scx_layered and wait for it (SIGKILL after stop_timeout_s).

        Returns its exit status, None when it was not running."""
        had = self._proc is not None
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(self.policy.stop_timeout_s + 5)
            self._thread = None
        with self._tick_lock:
            self._terminate(requested=True)
            with self._lock:
                self._state = STOPPED
                last = self._last_exit
        return last.code if had and last is not None else None

    def clear_safe_mode(self) -> None:
        """Forget the crash history and refusals; the next tick starts scx_layered again."""
        with self._lock:
            self._crashes.clear()
            self._safe_reason = None
            self._next_start_at = 0.0
            if self._state in (SAFE_MODE, REFUSED, STOPPED):
                self._state = IDLE

    @property
    def safe_mode(self) -> bool:
        return self._safe_reason is not None

    @property
    def safe_mode_reason(self) -> Optional[str]:
        return self._safe_reason

    @property
    def state(self) -> str:
        return self._state

    @property
    def pid(self) -> Optional[int]:
        proc = self._proc
        return proc.pid if proc is not None else None

    def stats(self) -> Optional[SysStats]:
        """The latest stats reply (scx_layered's `top` stats); None while it does not run."""
        return self._stats.latest

    def status(self) -> SupervisorStatus:
        """Everything `temperctl status`, /observe and /metrics need, at this moment."""
        with self._lock:
            now = self.clock()
            pending = self._pending_since is not None
            return SupervisorStatus(
                state=self._state,
                pid=self.pid,
                binary=self.binary,
                args=self.args,
                config_path=self.config_path,
                log_path=self.log_path,
                stats_socket=self.stats_socket_path,
                uptime_s=round(now - self._started_at, 3) if self._started_at is not None and self._proc else None,
                pending_change=pending,
                next_restart_in_s=round(max(0.0, self._restart_due() - now), 3) if pending else None,
                safe_mode=self._safe_reason is not None,
                safe_mode_reason=self._safe_reason,
                crashes_in_window=len(self._crashes),
                last_exit=self._last_exit,
                default_scheduler_gap_last_s=self._gap_last_s,
                default_scheduler_gap_total_s=round(self._gap_total_s, 3),
                stats_age_s=self._stats.age_s,
                stats_error=self._stats.error,
                stats_reads=self._stats.reads,
                stats_errors=self._stats.errors,
                **self.counters,
            )

    # ---- the state machine -----------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stopping.is_set():
            try:
                self.tick()
            except Exception:  # keep supervising; the next tick retries
                log.exception("scx supervisor tick failed")
            self._stopping.wait(self.policy.tick_s)
        with self._tick_lock:  # the child's PDEATHSIG is tied to this thread: stop it here
            self._terminate(requested=True)

    def tick(self) -> None:
        with self._tick_lock:
            self._tick()

    def _tick(self) -> None:
        if self._state in (SAFE_MODE, REFUSED, STOPPED) or self._stopping.is_set() and self._thread is not None:
            return
        proc = self._proc
        if proc is not None and proc.poll() is not None:
            self._on_exit(proc.returncode, requested=False)
        if self._state in (SAFE_MODE, REFUSED):
            return
        if self._proc is None:
            if self._desired is not None and self.clock() >= self._next_start_at:
                self._start()
        elif self._pending_since is not None and self.clock() >= self._restart_due():
            self._terminate(requested=True)
            with self._lock:
                self.counters["restarts"] += 1
            self._start()
        if self._proc is not None:
            if self._state == STARTING:
                self._check_attached()
            if self._state == RUNNING:
                self._stats.poll()

    def _restart_due(self) -> float:
        assert self._pending_since is not None
        last = self._started_at if self._started_at is not None else float("-inf")
        return max(self._pending_since + self.policy.batch_s, last + self.policy.min_interval_s)

    def _start(self) -> None:
        now = self.clock()
        ours_just_exited = self._exited_at is not None and now - self._exited_at < self.policy.busy_grace_s
        reason, passing = start_blocker(self.sysfs_root, ours_just_exited)
        if reason is not None:
            if passing:
                self._busy_since = self._busy_since if self._busy_since is not None else now
                if now - self._busy_since < self.policy.busy_grace_s:
                    self._next_start_at = now + min(0.5, self.policy.busy_grace_s)
                    return
            with self._lock:
                self.counters["refusals"] += 1
            self._enter_safe_mode(REFUSED, f"refusing to start scx_layered: {reason}")
            return
        self._busy_since = None
        untrusted = binary_trust_problem(self.binary)
        if untrusted:  # checked at each start: the file may have changed since the last one
            self._enter_safe_mode(SAFE_MODE, f"refusing to run scx_layered: {untrusted}")
            return
        with self._lock:
            text = self._desired
        assert text is not None
        os.makedirs(self.state_dir, exist_ok=True)
        write_atomically(self.config_path, text)
        argv = [self.binary, *self.args, f"f:{self.config_path}"]
        try:
            proc = spawn(argv, self.log_path, self.env or {})
        except OSError as exc:
            self._enter_safe_mode(SAFE_MODE, f"cannot run {self.binary}: {exc}")
            return
        log.info("started %s (pid %d)", " ".join(argv), proc.pid)
        with self._lock:
            self._proc = proc
            self._running = text
            self._pending_since = None
            self._started_at = now
            self._attach_deadline = now + self.policy.attach_timeout_s
            self._state = STARTING
            self.counters["starts"] += 1
            if self._after_crash:
                self.counters["crash_restarts"] += 1
            self._after_crash = False

    def _check_attached(self) -> None:
        if not self._stats.attach():
            if self.clock() > self._attach_deadline:
                log.warning("scx_layered did not attach within %.0f s", self.policy.attach_timeout_s)
                self._terminate(requested=False,
                                reason=f"did not attach (stats socket {self.stats_socket_path} silent) "
                                       f"within {self.policy.attach_timeout_s:g} s")
            return
        now = self.clock()
        with self._lock:
            self._state = RUNNING
            if self._gap_since is not None:
                self._gap_last_s = round(now - self._gap_since, 3)
                self._gap_total_s += now - self._gap_since
                self._gap_since = None
        log.info("scx_layered attached (pid %d)", self.pid or -1)

    def _terminate(self, requested: bool, reason: Optional[str] = None) -> Optional[int]:
        proc = self._proc
        if proc is None:
            return None
        terminate(proc, self.policy.stop_timeout_s)
        self._on_exit(proc.returncode, requested=requested, reason=reason)
        return proc.returncode

    def _on_exit(self, code: int, requested: bool, reason: Optional[str] = None) -> None:
        self._stats.detach()
        now = self.clock()
        signalled_by_us = reason is not None  # _terminate with a reason: we stopped one that failed to attach
        reason = reason or exit_reason(self.log_path, code)
        record = ExitRecord(code, requested, reason, time.time())
        with self._lock:
            self._proc = None
            self._exited_at = now
            self._last_exit = record
            self._gap_since = now if self._state == RUNNING else self._gap_since
            self._state = IDLE
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
                self._state = BACKOFF
            return
        log.warning("scx_layered exited unexpectedly: %s", reason)
        keep_crash_log(self.log_path, os.path.join(self.state_dir, CRASH_LOG_FILE))
        with self._lock:
            self.counters["crashes"] += 1
            crashes = self._crashes.record(now)
            self._after_crash = True
        if self._crashes.too_many(crashes):
            self._enter_safe_mode(SAFE_MODE, f"scx_layered exited {crashes} times within "
                                             f"{self.policy.crash_window_s:g} s (last: {reason}); "
                                             "the native backend carries the plan")
            return
        with self._lock:
            self._next_start_at = now + self._crashes.backoff_s(crashes)
            self._state = BACKOFF

    def _enter_safe_mode(self, state: str, reason: str) -> None:
        with self._lock:
            self._state = state
            self._safe_reason = reason
            self.counters["safe_mode_entries"] += 1
        log.error("scx backend: %s", reason)
        if self.on_safe_mode is not None:
            try:
                self.on_safe_mode(reason)
            except Exception:
                log.exception("safe-mode callback failed")
