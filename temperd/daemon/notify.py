"""sd_notify: READY, RELOADING, STOPPING, STATUS and watchdog pings to systemd."""

from __future__ import annotations

import os
from typing import Optional


class Notifier:
    """Talks to systemd when it runs temperd (NOTIFY_SOCKET set); silent otherwise."""

    def __init__(self) -> None:
        self._notifier = None
        if os.environ.get("NOTIFY_SOCKET"):
            import sdnotify

            self._notifier = sdnotify.SystemdNotifier()
        usec = int(os.environ.get("WATCHDOG_USEC", "0") or 0)
        # Ping at half the unit's WatchdogSec; None when the unit sets none.
        self.watchdog_interval_s: Optional[float] = usec / 2e6 if usec else None

    def notify(self, text: str) -> None:
        if self._notifier is not None:
            self._notifier.notify(text)
