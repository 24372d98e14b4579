"""Run scx_layered with the rendered configuration and keep it honest.

- Start: refuse when another sched_ext scheduler holds the kernel (named from
  /sys/kernel/sched_ext/root/ops); write the config atomically under the state directory; run
  `scx_layered [ARGS] f:<file>` with its output in `scx_layered.log`; it counts as attached
  once its stats socket answers. The child gets SIGTERM if the thread that started it dies
  (PR_SET_PDEATHSIG), so scx_layered never outlives temperd; start the supervisor from a
  thread that lives as long as it (start() runs its own).
- Stats: one connection to the stats socket, kept open (scx_layered reports deltas since the
  previous request on the same connection), read every stats_interval_s into a dict.
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

import collections
import ctypes
import errno
import json
import logging
import os
import signal
import socket
import subprocess
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Deque, Dict, List, Mapping, Optional, Sequence, Tuple

from temperd.backends.scx.detect import (LAYERED_OPS_PREFIX, binary_trust_problem, describe_loaded, read_state,
                                         sched_ext_dir)
from temperd.backends.scx.validate import errors_of, validate_config
from temperd.config.daemon_config import ScxSettings
from temperd.files import write_atomically

log = logging.getLogger(__name__)

_CONFIGURED = ScxSettings()  # the defaults of temperd.toml's [scx] table, declared in its spec
DEFAULT_STATS_SOCKET = _CONFIGURED.stats_socket
CONFIG_FILE = "scx_layered.json"
LOG_FILE = "scx_layered.log"
CRASH_LOG_FILE = "scx_layered.crash.log"
STATS_REQUEST = {"req": "stats", "args": {"target": "top"}}

IDLE = "idle"  # no config yet
STARTING = "starting"  # process started, stats socket not answering yet
RUNNING = "running"
BACKOFF = "backoff"  # waiting to start again after a crash
REFUSED = "refused"  # another sched_ext scheduler is loaded
SAFE_MODE = "safe_mode"  # crash loop: no more starts until clear_safe_mode()
STOPPED = "stopped"


@dataclass(frozen=True)
class RestartPolicy:
    """min_interval_s, crash_limit and crash_window_s come from temperd.toml's [scx] table
    (restart_policy() in scx/backend.py) and default to that table's defaults; the rest are fixed."""

    min_interval_s: float = _CONFIGURED.min_restart_interval_s  # between two starts for plan changes
    batch_s: float = 2.0  # after the first change, wait this long for more before restarting
    crash_limit: int = _CONFIGURED.crash_limit  # this many unrequested exits ...
    crash_window_s: float = _CONFIGURED.crash_window_s  # ... within this window: safe mode
    crash_backoff_s: float = 2.0  # wait before starting again after a crash, doubled per crash in the window
    max_backoff_s: float = 60.0
    # Start to stats socket: BPF load + verification takes seconds on big hosts, and the real
    # scx_layered 1.1.2 took about 30 s under software emulation (the VM test's guest).
    attach_timeout_s: float = 90.0
    busy_grace_s: float = 5.0  # sched_ext still "disabling" after our own exit: wait this long
    stop_timeout_s: float = 10.0  # SIGTERM, then SIGKILL
    stats_interval_s: float = 1.0
    stats_timeout_s: float = 2.0
    tick_s: float = 0.1  # the monitor thread's period


@dataclass(frozen=True)
class ExitRecord:
    code: int  # negative: killed by that signal (Popen convention)
    requested: bool  # temperd asked it to stop
    reason: str  # the `EXIT:` line scx_layered printed, or the status
    wall_time: float


@dataclass(frozen=True)
class SupervisorStatus:
    """Everything `temperctl status`, /observe and /metrics need about scx_layered's process."""

    state: str  # IDLE, STARTING, RUNNING, BACKOFF, REFUSED, SAFE_MODE or STOPPED
    pid: Optional[int]
    binary: str
    args: Tuple[str, ...]
    config_path: str
    log_path: str
    stats_socket: str
    uptime_s: Optional[float]
    pending_change: bool  # a new config waits for its (batched, rate-limited) restart
    next_restart_in_s: Optional[float]
    safe_mode: bool
    safe_mode_reason: Optional[str]
    crashes_in_window: int
    last_exit: Optional[ExitRecord]
    default_scheduler_gap_last_s: Optional[float]  # the host on the kernel's default scheduler between runs
    default_scheduler_gap_total_s: float
    stats_age_s: Optional[float]
    stats_error: Optional[str]
    # Counts since the supervisor was made (cumulative).
    starts: int
    restarts: int  # for plan changes
    crash_restarts: int
    crashes: int  # exits temperd did not ask for
    outside_stops: int  # clean exits on a signal temperd did not send (systemctl stop, kill): not crashes
    coalesced_changes: int
    refusals: int  # starts refused: another sched_ext scheduler was loaded
    stats_reads: int
    stats_errors: int
    safe_mode_entries: int

    def as_dict(self) -> Dict[str, Any]:
        """As `temperctl status --json` and /observe show it (backend.scx_layered)."""
        return {
            "state": self.state,
            "pid": self.pid,
            "binary": self.binary,
            "args": list(self.args),
            "config_path": self.config_path,
            "log_path": self.log_path,
            "stats_socket": self.stats_socket,
            "uptime_s": self.uptime_s,
            "pending_change": self.pending_change,
            "next_restart_in_s": self.next_restart_in_s,
            "safe_mode": self.safe_mode,
            "safe_mode_reason": self.safe_mode_reason,
            "crashes_in_window": self.crashes_in_window,
            "last_exit": asdict(self.last_exit) if self.last_exit else None,
            "default_scheduler_gap_s": {"last": self.default_scheduler_gap_last_s,
                                        "total": self.default_scheduler_gap_total_s},
            "stats_age_s": self.stats_age_s,
            "stats_error": self.stats_error,
            **{name: getattr(self, name) for name in COUNTERS},
        }


COUNTERS = ("starts", "restarts", "crash_restarts", "crashes", "outside_stops", "coalesced_changes", "refusals",
            "stats_reads", "stats_errors", "safe_mode_entries")
# Exit statuses of a scx_layered that was told to stop: it catches SIGTERM, SIGINT and SIGHUP,
# detaches and exits 0 ("EXIT: unregistered from user space"); negative: killed by that signal
# before it installed its handler.
STOPPED_BY_SIGNAL = (0, -signal.SIGTERM, -signal.SIGINT, -signal.SIGHUP)


class ScxConfigError(ValueError):
    def __init__(self, problems: Sequence[str]):
        self.problems = tuple(problems)
        super().__init__("scx_layered config rejected: " + "; ".join(self.problems))


class StatsError(RuntimeError):
    pass


class StatsClient:
    """One connection to an scx_stats socket; requests are one JSON line each way."""

    def __init__(self, path: str, timeout: float = 2.0):
        self.path = path
        self.timeout = timeout
        self._sock: Optional[socket.socket] = None
        self._reader = None

    @property
    def connected(self) -> bool:
        return self._sock is not None

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.path)
        except OSError:
            sock.close()
            raise
        self._sock, self._reader = sock, sock.makefile("rb")

    def request(self, request: Mapping[str, Any]) -> Any:
        if self._sock is None:
            self.connect()
        assert self._sock is not None and self._reader is not None
        self._sock.sendall((json.dumps(request) + "\n").encode())
        line = self._reader.readline()
        if not line:
            raise StatsError("the stats socket closed the connection")
        reply = json.loads(line)
        if not isinstance(reply, dict) or "errno" not in reply:
            raise StatsError(f"unexpected stats reply: {line[:200]!r}")
        resp = (reply.get("args") or {}).get("resp")
        if reply["errno"]:
            raise StatsError(f"stats request failed: {os.strerror(reply['errno'])}: {resp}")
        return resp

    def close(self) -> None:
        for thing in (self._reader, self._sock):
            if thing is not None:
                try:
                    thing.close()
                except OSError:
                    pass
        self._sock = self._reader = None


_PRCTL = ctypes.CDLL(None, use_errno=True).prctl  # resolved before any fork
PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # runs in the child between fork and exec
    _PRCTL(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)


def _exit_reason(log_path: str, code: int) -> str:
    """scx_layered's own `EXIT: ...` line if it printed one, else the exit status."""
    try:
        with open(log_path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 65536))
            lines = handle.read().decode("utf-8", "replace").splitlines()
    except OSError:
        lines = []
    for line in reversed(lines):
        if line.startswith("EXIT:"):
            return line.strip()
    for line in reversed(lines):
        if line.startswith("Error:") or "panicked" in line:
            return line.strip()[:300]
    return f"killed by signal {-code}" if code < 0 else f"exit status {code}"


SYSTEM_STAT_FIELDS = ("busy", "util", "total", "local_sel", "local_enq", "open_idle", "affn_viol", "hi_fb", "lo_fb",
                      "proc_ms", "antistall", "system_cpu_util_ewma")
LAYER_STAT_FIELDS = ("util", "util_frac", "util_open_frac", "util_protected_frac", "tasks", "cur_nr_cpus",
                     "min_nr_cpus", "max_nr_cpus", "slice_us", "preempt", "affn_viol", "migration")


def summarize_stats(stats: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    """The numeric fields worth a metric, {"system": {field: value}, "layers": {name: {field: value}}}.

    scx_layered adds stats fields from release to release: unknown ones are ignored and
    missing ones left out, never an error."""
    def numbers(source: Any, fields: Sequence[str]) -> Dict[str, float]:
        if not isinstance(source, Mapping):
            return {}
        return {f: source[f] for f in fields
                if isinstance(source.get(f), (int, float)) and not isinstance(source.get(f), bool)}

    layers = stats.get("layers") if isinstance(stats, Mapping) else None
    return {"system": numbers(stats, SYSTEM_STAT_FIELDS),
            "layers": {name: numbers(values, LAYER_STAT_FIELDS) for name, values in sorted((layers or {}).items())}}


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
        self._crash_times: Deque[float] = collections.deque()
        self._after_crash = False
        self._safe_reason: Optional[str] = None
        self._last_exit: Optional[ExitRecord] = None
        self._stats: Optional[Dict[str, Any]] = None
        self._stats_wall: Optional[float] = None
        self._next_stats_at = 0.0
        self._stats_error: Optional[str] = None
        self._client = StatsClient(stats_socket_path, policy.stats_timeout_s)
        self.counters: Dict[str, int] = dict.fromkeys(COUNTERS, 0)
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
            self._crash_times.clear()
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

    def stats(self) -> Optional[Dict[str, Any]]:
        """The latest SysStats reply (scx_layered's `top` stats), as read."""
        with self._lock:
            return dict(self._stats) if self._stats is not None else None

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
                crashes_in_window=len(self._crash_times),
                last_exit=self._last_exit,
                default_scheduler_gap_last_s=self._gap_last_s,
                default_scheduler_gap_total_s=round(self._gap_total_s, 3),
                stats_age_s=round(time.time() - self._stats_wall, 3) if self._stats_wall else None,
                stats_error=self._stats_error,
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
            if self._state == RUNNING and self.clock() >= self._next_stats_at:
                self._read_stats()

    def _restart_due(self) -> float:
        assert self._pending_since is not None
        last = self._started_at if self._started_at is not None else float("-inf")
        return max(self._pending_since + self.policy.batch_s, last + self.policy.min_interval_s)

    def _start(self) -> None:
        now = self.clock()
        state, ops = read_state(self.sysfs_root)
        if state != "disabled":
            # Our own scx_layered may still be unloading: the kernel disables sched_ext
            # asynchronously after the process is gone.
            recent = self._exited_at is not None and now - self._exited_at < self.policy.busy_grace_s
            ours_leaving = state in ("disabling", "enabling") or (
                recent and (state is None or (state == "enabled" and (ops or "").startswith(LAYERED_OPS_PREFIX))))
            if ours_leaving:
                self._busy_since = self._busy_since if self._busy_since is not None else now
                if now - self._busy_since < self.policy.busy_grace_s:
                    self._next_start_at = now + min(0.5, self.policy.busy_grace_s)
                    return
            if state is None and not os.path.isdir(sched_ext_dir(self.sysfs_root)):
                reason = f"no {sched_ext_dir(self.sysfs_root)}: kernel without CONFIG_SCHED_CLASS_EXT"
            else:
                reason = describe_loaded(state, ops, self.sysfs_root)
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
        # scx_layered colours its log lines (ANSI escapes) even into a file, unless NO_COLOR is set.
        env = {**os.environ, "NO_COLOR": "1", **(self.env or {})}
        with open(self.log_path, "wb") as output:
            try:
                proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT,
                                        env=env, preexec_fn=_die_with_parent, close_fds=True)
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
        try:
            self._client.close()
            self._client.connect()
        except OSError:
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
            self._next_stats_at = now
        log.info("scx_layered attached (pid %d)", self.pid or -1)

    def _read_stats(self) -> None:
        self._next_stats_at = self.clock() + self.policy.stats_interval_s
        try:
            resp = self._client.request(STATS_REQUEST)
        except (OSError, ValueError, StatsError) as exc:
            self._client.close()  # reconnect on the next read
            with self._lock:
                self.counters["stats_errors"] += 1
                self._stats_error = f"{type(exc).__name__}: {exc}"
            return
        with self._lock:
            self._stats = resp if isinstance(resp, dict) else {"value": resp}
            self._stats_wall = time.time()
            self._stats_error = None
            self.counters["stats_reads"] += 1

    def _terminate(self, requested: bool, reason: Optional[str] = None) -> Optional[int]:
        proc = self._proc
        if proc is None:
            return None
        if proc.poll() is None:
            try:
                proc.send_signal(signal.SIGTERM)
                proc.wait(self.policy.stop_timeout_s)
            except subprocess.TimeoutExpired:
                log.warning("scx_layered ignored SIGTERM for %.0f s: SIGKILL", self.policy.stop_timeout_s)
                proc.kill()
                proc.wait()
            except ProcessLookupError:
                proc.wait()
        self._on_exit(proc.returncode, requested=requested, reason=reason)
        return proc.returncode

    def _on_exit(self, code: int, requested: bool, reason: Optional[str] = None) -> None:
        self._client.close()
        now = self.clock()
        signalled_by_us = reason is not None  # _terminate with a reason: we stopped one that failed to attach
        reason = reason or _exit_reason(self.log_path, code)
        record = ExitRecord(code, requested, reason, time.time())
        with self._lock:
            self._proc = None
            self._exited_at = now
            self._last_exit = record
            self._gap_since = now if self._state == RUNNING else self._gap_since
            self._stats = None
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
        self._keep_crash_log()
        with self._lock:
            self.counters["crashes"] += 1
            self._crash_times.append(now)
            while self._crash_times and self._crash_times[0] < now - self.policy.crash_window_s:
                self._crash_times.popleft()
            crashes = len(self._crash_times)
            self._after_crash = True
        if crashes >= self.policy.crash_limit:
            self._enter_safe_mode(SAFE_MODE, f"scx_layered exited {crashes} times within "
                                             f"{self.policy.crash_window_s:g} s (last: {reason}); "
                                             "the native backend carries the plan")
            return
        backoff = min(self.policy.max_backoff_s, self.policy.crash_backoff_s * 2 ** (crashes - 1))
        with self._lock:
            self._next_start_at = now + backoff
            self._state = BACKOFF

    def _keep_crash_log(self) -> None:
        """The crashed run's output (EXIT line, DEBUG DUMP) survives the next start."""
        try:
            os.replace(self.log_path, os.path.join(self.state_dir, CRASH_LOG_FILE))
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                log.warning("cannot keep the scx_layered crash log: %s", exc)

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
