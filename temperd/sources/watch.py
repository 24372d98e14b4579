"""Watching what the daemon must react to: configuration files (watchdog/inotify) and CPU hotplug (udev)."""

from __future__ import annotations

import logging
import os
import threading
from typing import Callable, Optional

log = logging.getLogger("temperd.sources.watch")


class Debouncer:
    """Calls `action` once, `delay_s` after the last of a burst of pokes (an editor writes a file in
    several steps; a whole directory may be copied in)."""

    def __init__(self, delay_s: float, action: Callable[[], None]):
        self.delay_s = delay_s
        self.action = action
        self._timer: Optional[threading.Timer] = None
        self._lock = threading.Lock()

    def poke(self) -> None:
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
            self._timer = threading.Timer(self.delay_s, self.action)
            self._timer.daemon = True
            self._timer.start()

    def cancel(self) -> None:
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None


# Event types that change a file or directory. watchdog >= 2.3 also reports "opened" and
# "closed_no_write": the daemon reading its own configuration must not count as an edit, or each
# reload would trigger the next one.
EDIT_EVENTS = frozenset({"created", "deleted", "modified", "moved", "closed"})


def is_config_edit(event_type: str, is_directory: bool, paths) -> bool:
    """Whether a watchdog event is an edit that asks for a reload."""
    if event_type not in EDIT_EVENTS:
        return False
    # A directory's own "modified" comes with any file in it: only its creation, removal or
    # renaming counts (profiles.d appearing), besides *.toml files.
    if is_directory and event_type != "modified":
        return True
    return any(str(p).endswith(".toml") for p in paths)


class ConfigWatcher:
    """Watches the configuration directory (temperd.toml and profiles.d/, recursively) for TOML edits."""

    def __init__(self, config_dir: str, profile_dir: str, on_change: Callable[[], None], debounce_s: float = 0.15):
        from watchdog.events import FileSystemEventHandler
        from watchdog.observers import Observer

        self.debouncer = Debouncer(debounce_s, on_change)
        debouncer = self.debouncer

        class _Handler(FileSystemEventHandler):
            def on_any_event(self, event) -> None:
                paths = [getattr(event, "src_path", ""), getattr(event, "dest_path", "")]
                if is_config_edit(event.event_type, event.is_directory, paths):
                    debouncer.poke()

        self._observer = Observer()
        watched = {os.path.realpath(config_dir)}
        if os.path.isdir(profile_dir) and not os.path.realpath(profile_dir).startswith(os.path.realpath(config_dir) + os.sep):
            watched.add(os.path.realpath(profile_dir))
        for path in sorted(watched):
            if os.path.isdir(path):
                self._observer.schedule(_Handler(), path, recursive=True)

    def start(self) -> None:
        self._observer.daemon = True
        self._observer.start()

    def stop(self) -> None:
        self.debouncer.cancel()
        self._observer.stop()
        self._observer.join(timeout=2)


class CpuHotplugWatcher:
    """Calls on_change when a CPU goes on- or offline (udev `cpu` subsystem)."""

    def __init__(self, on_change: Callable[[], None]):
        self.on_change = on_change
        self._observer = None
        self.active = False
        self.reason = ""

    def start(self) -> None:
        try:
            import pyudev

            context = pyudev.Context()
            # Without udevd (containers, minimal hosts) nothing is re-broadcast on the udev group:
            # listen to the kernel's own uevents there.
            source = "udev" if os.path.exists("/run/udev/control") else "kernel"
            monitor = pyudev.Monitor.from_netlink(context, source=source)
            monitor.filter_by(subsystem="cpu")

            def _event(device) -> None:
                if device.action in ("online", "offline", "add", "remove", "change"):
                    log.info("CPU hotplug: %s %s", device.action, device.sys_name)
                    self.on_change()

            self._observer = pyudev.MonitorObserver(monitor, callback=_event, name="cpu-hotplug")
            self._observer.daemon = True
            self._observer.start()
            self.active = True
            self.reason = f"watching {source} cpu events"
        except Exception as exc:  # pyudev missing or netlink refused: shape is re-read at reload instead
            self.active = False
            self.reason = f"CPU hotplug not watched: {exc}"
            log.warning("%s", self.reason)

    def stop(self) -> None:
        if self._observer is not None:
            self._observer.stop()
            self._observer = None
