"""When the scx supervisor starts scx_layered again (its restart policy, the plan change waiting
for a restart, the crash history), and what each restart costs the host."""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Deque, Hashable, NamedTuple, Optional, Tuple

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

    def backoff_s(self, crashes: int) -> float:
        """Doubling per crash in the window, capped."""
        return min(self.policy.max_backoff_s, self.policy.crash_backoff_s * 2 ** (crashes - 1))

    def clear(self) -> None:
        self._times.clear()


class ScxRun(NamedTuple):
    """What scx_layered runs: a config (canonical JSON) and the command-line options it was
    rendered for (--allow-partial-core), beyond temperd.toml's [scx] args."""

    config: str
    options: Tuple[str, ...] = ()


class PlanChanges:
    """The run (ScxRun) asked for against the one scx_layered runs. scx_layered has no reload, so
    a change means a restart: it waits batch_s for more changes (coalescing them into one
    restart), and min_interval_s after the last start."""

    def __init__(self, policy: RestartPolicy):
        self.policy = policy
        self.desired: Optional[Hashable] = None  # the run asked for
        self.running: Optional[Hashable] = None  # ... and the one the process runs
        self.pending_since: Optional[float] = None
        self.coalesced = 0  # changes that replaced one still waiting for its restart

    def ask(self, run: Hashable, process_runs: bool, now: float) -> bool:
        """Ask for this run; True when it differs from what runs or waits."""
        if run == self.desired:
            return False
        if self.pending_since is not None:
            self.coalesced += 1
        self.desired = run
        if run == self.running:
            self.pending_since = None  # back to what runs: nothing to do
            return False
        if process_runs and self.pending_since is None:
            self.pending_since = now
        return True

    @property
    def pending(self) -> bool:
        return self.pending_since is not None

    def restart_due(self, last_start: Optional[float]) -> float:
        """When the waiting change restarts scx_layered: after the batch delay and the rate limit."""
        assert self.pending_since is not None
        last = last_start if last_start is not None else float("-inf")
        return max(self.pending_since + self.policy.batch_s, last + self.policy.min_interval_s)

    def started(self, run: Hashable, now: float) -> None:
        """scx_layered started with this run: nothing waits any more, unless another was asked
        for while it started (that one waits for its restart from now)."""
        self.running = run
        self.pending_since = None if self.desired == run else now


class DefaultSchedulerGap:
    """What restarts cost: the time the host runs on the kernel's default scheduler between the
    exit of a scx_layered that had attached and the attach of the next one."""

    def __init__(self) -> None:
        self._since: Optional[float] = None
        self.last_s: Optional[float] = None
        self.total_s = 0.0

    def begin(self, now: float) -> None:
        self._since = now

    def end(self, now: float) -> None:
        if self._since is not None:
            self.last_s = round(now - self._since, 3)
            self.total_s += now - self._since
            self._since = None
