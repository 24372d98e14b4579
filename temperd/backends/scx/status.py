"""What the scx supervisor reports: its states, the last exit, the status `temperctl status`,
/observe and /metrics show. Plain data with no imports from temperd, so that it can move to
wherever the backends' status types live."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Dict, Mapping, Optional, Tuple

IDLE = "idle"  # no config yet
STARTING = "starting"  # process started, stats socket not answering yet
RUNNING = "running"
BACKOFF = "backoff"  # waiting to start again after a crash
REFUSED = "refused"  # another sched_ext scheduler is loaded
SAFE_MODE = "safe_mode"  # crash loop: no more starts until clear_safe_mode()
STOPPED = "stopped"


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


@dataclass(frozen=True)
class ScxStatus:
    """The scx backend's own state, inside its BackendStatus."""

    fallback_reason: Optional[str]  # why the native backend carries the plan; None while scx_layered does
    safe_mode: bool
    safe_mode_reason: Optional[str]
    render_notes: Tuple[str, ...]
    render_problems: Tuple[str, ...]
    supervisor: SupervisorStatus
    # scx_layered's latest stats, its numeric fields only (stats.summarize_stats): host-wide and per layer
    system_stats: Mapping[str, float]
    layer_stats: Mapping[str, Mapping[str, float]]
    layer_cpus: Mapping[str, Tuple[int, ...]] = field(default_factory=dict)  # the CPUs each layer holds now
    layer_text: Mapping[str, str] = field(default_factory=dict)  # each layer as `temperctl status` shows it

    def layer_view(self, name: str) -> Optional[Dict[str, Any]]:
        """One layer's stats beside the plan (`temperctl status`, /observe); None if it reported none."""
        if name not in self.layer_stats:
            return None
        numbers = self.layer_stats[name]
        return {"util_pct": numbers.get("util"), "tasks": numbers.get("tasks"), "cpus_held": numbers.get("cur_nr_cpus"),
                "cpus": list(self.layer_cpus.get(name, ())), "text": self.layer_text.get(name, "-")}

    def as_dict(self) -> Dict[str, Any]:
        return {
            "fallback_reason": self.fallback_reason,
            "safe_mode": self.safe_mode,
            "safe_mode_reason": self.safe_mode_reason,
            "render_notes": list(self.render_notes),
            "render_problems": list(self.render_problems),
            "scx_layered": self.supervisor.as_dict(),
            "scx_stats": {"system": dict(self.system_stats),
                          "layers": {k: {**dict(v), "cpus": list(self.layer_cpus.get(k, ()))}
                                     for k, v in self.layer_stats.items()}},
        }
