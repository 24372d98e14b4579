"""The control-socket commands `classify` and `rightsize`: what temperd has learned of each tracked
workload (observe/learner.py), for `temperctl classify` and `temperctl rightsize`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict

from temperd.control.protocol import ControlError, Progress
from temperd.daemon.trace_commands import pid_and_unit

if TYPE_CHECKING:
    from temperd.daemon.state import DaemonState


class LearnerCommands:
    def __init__(self, daemon: "DaemonState"):
        self.daemon = daemon

    def _learner(self, enabled: str):
        learner = self.daemon.learner
        if learner is None or not getattr(learner.settings, enabled):
            raise ControlError(f"{enabled} is off in temperd.toml ([{enabled}] enabled = false)")
        return learner

    def classify(self, request: Dict[str, Any], progress: Progress) -> Dict[str, Any]:
        """{"cmd": "classify", "pid"?, "unit"?} -> {"classify": [workload-profile status, ...]}."""
        pid, unit = pid_and_unit(request)
        learner = self._learner("classify")
        return {"classify": [c.as_json() for c in learner.classifications(pid, unit)],
                "window_goal_s": learner.settings.window_s}

    def rightsize(self, request: Dict[str, Any], progress: Progress) -> Dict[str, Any]:
        """{"cmd": "rightsize", "pid"?, "unit"?} -> {"rightsize": [recommendation, ...], "host": totals}."""
        pid, unit = pid_and_unit(request)
        learner = self._learner("rightsizing")
        recommendations = [r.as_json() for r in learner.recommendations(pid, unit)]
        savings = sum(max(0.0, r["savings_cpus"] or 0.0) for r in recommendations)
        return {"rightsize": recommendations,
                "host": {"cpus": learner.host_cpus, "savings_cpus": round(savings, 2), "margin": learner.settings.margin,
                         "half_life_h": learner.settings.half_life_h, "history_file": learner.history.path}}
