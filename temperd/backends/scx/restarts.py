"""When the scx supervisor starts scx_layered again: its restart policy and crash history."""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Deque

from temperd.config.daemon_config import ScxSettings

_CONFIGURED = ScxSettings()  # the defaults of temperd.toml's [scx] table, declared in its spec


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


class CrashHistory:
    """The crashes within the policy's window: how long to wait, and when to give up."""

    def __init__(self, policy: RestartPolicy):
        self.policy = policy
        self._times: Deque[float] = collections.deque()

    def record(self, now: float) -> int:
        """One more crash at `now`; the crashes within the window, this one included."""
        self._times.append(now)
        while self._times and self._times[0] < now - self.policy.crash_window_s:
            self._times.popleft()
        return len(self._times)

    def __len__(self) -> int:
        return len(self._times)

    def too_many(self, crashes: int) -> bool:
        return crashes >= self.policy.crash_limit

    def backoff_s(self, crashes: int) -> float:
        """Doubling per crash in the window, capped."""
        return min(self.policy.max_backoff_s, self.policy.crash_backoff_s * 2 ** (crashes - 1))

    def clear(self) -> None:
        self._times.clear()
