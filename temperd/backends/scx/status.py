"""The scx supervisor's states and counts. What the scx backend reports is the typed status's
own ScxView, scx_layered's process in it a SupervisorView (control/status.py)."""

from __future__ import annotations

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
