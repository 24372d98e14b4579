"""The scx supervisor's states. What the scx backend reports is the typed status's
own ScxView, scx_layered's process in it a SupervisorView (control/status.py)."""

from __future__ import annotations

IDLE = "idle"  # no config yet
STARTING = "starting"  # process started, stats socket not answering yet
RUNNING = "running"
BACKOFF = "backoff"  # waiting to start again after a crash
REFUSED = "refused"  # another sched_ext scheduler is loaded
SAFE_MODE = "safe_mode"  # crash loop: no more starts until clear_safe_mode()
STOPPED = "stopped"
