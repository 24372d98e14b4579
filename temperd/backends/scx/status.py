"""What the scx supervisor reports: its states, and the scx backend's status that `temperctl
status`, /observe and /metrics show; scx_layered's process is the typed status's own
SupervisorView (control/status.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional, Tuple

from temperd.control.status import LayerScxView, ScxStatsView, ScxView, SupervisorView

IDLE = "idle"  # no config yet
STARTING = "starting"  # process started, stats socket not answering yet
RUNNING = "running"
BACKOFF = "backoff"  # waiting to start again after a crash
REFUSED = "refused"  # another sched_ext scheduler is loaded
SAFE_MODE = "safe_mode"  # crash loop: no more starts until clear_safe_mode()
STOPPED = "stopped"


# SupervisorView's counts since the supervisor was made.
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
    supervisor: SupervisorView
    # scx_layered's latest stats, its numeric fields only (stats.summarize_stats): host-wide and per layer
    system_stats: Mapping[str, float]
    layer_stats: Mapping[str, Mapping[str, float]]
    layer_cpus: Mapping[str, Tuple[int, ...]] = field(default_factory=dict)  # the CPUs each layer holds now
    layer_text: Mapping[str, str] = field(default_factory=dict)  # each layer as `temperctl status` shows it

    def layer_view(self, name: str) -> Optional[LayerScxView]:
        """One layer's stats beside the plan (`temperctl status`, /observe); None if it reported none."""
        if name not in self.layer_stats:
            return None
        numbers = self.layer_stats[name]
        return LayerScxView(numbers.get("util"), numbers.get("tasks"), numbers.get("cur_nr_cpus"),
                            list(self.layer_cpus.get(name, ())), self.layer_text.get(name, "-"))

    def view(self) -> ScxView:
        """As the Status carries it, inside the BackendView."""
        layers = {k: {**dict(v), "cpus": list(self.layer_cpus.get(k, ()))} for k, v in self.layer_stats.items()}
        return ScxView(self.fallback_reason, self.safe_mode, self.safe_mode_reason, list(self.render_notes),
                       list(self.render_problems), self.supervisor, ScxStatsView(dict(self.system_stats), layers))
