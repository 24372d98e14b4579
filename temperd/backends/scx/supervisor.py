"""Run scx_layered with the rendered configuration and keep it honest.

ScxSupervisor is what the daemon calls (apply a config, start, stop, status) and owns the thread
scx_layered is tied to; scx/lifecycle.py moves the process through its states on each tick.

- Start: refuse when another sched_ext scheduler holds the kernel (named from
  /sys/kernel/sched_ext/root/ops; a busy one that may be our own previous scx_layered unloading
  is waited for: scx/detect.py); write the config atomically under the state directory; run
  `scx_layered [ARGS] f:<file>` with its output in `scx_layered.log` (scx/process.py); it
  counts as attached once its stats socket answers (on_attach is told, and told again when an
  attached one exits). The child dies with the thread that started it, so start the supervisor
  from a thread that lives as long as it (start() runs its own).
- Stats: one connection to the stats socket, kept open (scx_layered reports deltas since the
  previous request on the same connection), read every stats_interval_s (scx/stats.py).
- What it reports: its states (scx/status.py) in the typed status's SupervisorView.
- Plan changes: scx_layered has no reload, so a new config means stop + start, and every
  restart leaves the host on the kernel's default scheduler for a moment. Changes are batched
  (batch_s after the first one) and restarts rate-limited (min_interval_s apart); restarts,
  coalesced changes and the time spent on the default scheduler are counted (scx/restarts.py).
- Exits: an exit temperd did not ask for is a crash (unless it is the clean exit of a
  scx_layered told to stop by someone else, e.g. systemd's SIGTERM to the whole unit); the next
  start waits a doubling backoff.
  crash_limit crashes within crash_window_s put the supervisor into safe mode: it stops
  starting scx_layered and reports why, so the daemon can carry the plan out natively.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any, Callable, List, Mapping, Optional, Sequence

from temperd.backends.scx.lifecycle import ScxLifecycle
from temperd.backends.scx.restarts import RestartPolicy, ScxRun
from temperd.backends.scx.stats import SysStats
from temperd.control.status import SupervisorView
from temperd.backends.scx.validate import errors_of, validate_config
from temperd.config.daemon_config import ScxSettings

log = logging.getLogger(__name__)

DEFAULT_STATS_SOCKET = ScxSettings().stats_socket


class ScxConfigError(ValueError):
    def __init__(self, problems: Sequence[str]):
        self.problems = tuple(problems)
        super().__init__("scx_layered config rejected: " + "; ".join(self.problems))


class ScxSupervisor:
    def __init__(self, binary: str, state_dir: str, stats_socket_path: str = DEFAULT_STATS_SOCKET, *,
                 sysfs_root: str = "/sys", clock: Callable[[], float] = time.monotonic,
                 policy: RestartPolicy = RestartPolicy(), args: Sequence[str] = (),
                 env: Optional[Mapping[str, str]] = None, cpu_count: Optional[int] = None,
                 gpu_support: bool = False, on_safe_mode: Optional[Callable[[str], None]] = None,
                 on_attach: Optional[Callable[[bool], None]] = None):
        self.binary = binary
        self.policy = policy
        self.args = tuple(args) + (("--enable-gpu-support",) if gpu_support and "--enable-gpu-support" not in args else ())
        self.cpu_count = cpu_count
        self.gpu_support = gpu_support
        self.on_safe_mode = on_safe_mode
        self.on_attach = on_attach  # True when scx_layered attached, False when an attached one exited

        # on_safe_mode and on_attach are read at each call: the backend sets them after this is made.
        self._life = ScxLifecycle(binary, self.args, dict(env or {}), state_dir, stats_socket_path, sysfs_root,
                                  policy, clock,
                                  lambda reason: _tell(self.on_safe_mode, reason, "safe-mode"),
                                  lambda attached: _tell(self.on_attach, attached, "attach"))
        self.config_path = self._life.config_path
        self._tick_lock = threading.Lock()  # one tick at a time
        self._thread: Optional[threading.Thread] = None
        self._stopping = threading.Event()

    # ---- what the daemon calls -------------------------------------------------------------------

    def apply(self, config: List[dict], options: Sequence[str] = ()) -> bool:
        """Ask for this config, to run with these scx_layered options (the render's, beyond
        [scx] args). Returns True when it differs from what is running or pending.

        The restart happens in tick(), batched and rate-limited. Raises ScxConfigError for a
        config the validator rejects (the running one stays)."""
        problems = errors_of(validate_config(config, cpu_count=self.cpu_count, gpu_support=self.gpu_support))
        if problems:
            raise ScxConfigError([f"{p.path}: {p.message} [{p.rule}]" for p in problems])
        return self._life.ask(ScxRun(json.dumps(config, indent=2, sort_keys=True) + "\n", tuple(options)))

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
        had = self._life.pid is not None
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(self.policy.stop_timeout_s + 5)
            self._thread = None
        with self._tick_lock:
            last = self._life.stop()
        return last.code if had and last is not None else None

    def clear_safe_mode(self) -> None:
        """Forget the crash history and refusals; the next tick starts scx_layered again."""
        self._life.clear_safe_mode()

    @property
    def safe_mode(self) -> bool:
        return self._life.safe_reason is not None

    @property
    def safe_mode_reason(self) -> Optional[str]:
        return self._life.safe_reason

    @property
    def state(self) -> str:
        return self._life.state

    @property
    def pid(self) -> Optional[int]:
        return self._life.pid

    def stats(self) -> Optional[SysStats]:
        """The latest stats reply (scx_layered's `top` stats); None while it does not run."""
        return self._life.stats.latest

    def status(self) -> SupervisorView:
        """Everything `temperctl status`, /observe and /metrics need, at this moment."""
        return self._life.status()

    # ---- the thread ------------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stopping.is_set():
            try:
                self.tick()
            except Exception:  # keep supervising; the next tick retries
                log.exception("scx supervisor tick failed")
            self._stopping.wait(self.policy.tick_s)
        with self._tick_lock:  # the child's PDEATHSIG is tied to this thread: stop it here
            self._life.stop_process()

    def tick(self) -> None:
        with self._tick_lock:
            if not (self._stopping.is_set() and self._thread is not None):  # stop() takes over
                self._life.tick()


def _tell(callback: Optional[Callable[[Any], None]], value: Any, what: str) -> None:
    """From the lifecycle, on the ticking thread: tell whoever set the callback; its failure is logged."""
    if callback is not None:
        try:
            callback(value)
        except Exception:
            log.exception("%s callback failed", what)
