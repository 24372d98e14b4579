"""The threads that serve and watch, started once temperd runs and stopped before it restores:
the control socket, HTTP (/metrics, /observe), the configuration watcher and the CPU hotplug
watcher. The watchers only ask the main loop for a reload."""

from __future__ import annotations

import logging
from typing import Any, Callable, Dict, List, Optional

from temperd.config.daemon_config import DaemonConfig
from temperd.daemon.control import ControlServer, Handler
from temperd.daemon.main_loop import RELOAD
from temperd.observe.http import HttpApi
from temperd.sources.watch import ConfigWatcher, CpuHotplugWatcher

log = logging.getLogger("temperd")


class Services:
    def __init__(self) -> None:
        self.http: Optional[HttpApi] = None
        self._running: List[Any] = []

    def start(self, config: DaemonConfig, config_dir: str, handlers: Dict[str, Handler],
              metrics: Callable[[], bytes], observe: Callable[[], dict],
              request: Callable[[str, str], None]) -> None:
        """handlers: the control socket's commands; metrics, observe: the HTTP bodies;
        request(kind, trigger): ask the main loop."""
        self._add(ControlServer(config.control_socket, handlers, config.control_group))
        if config.http_port:
            self.http = self._add(HttpApi(config.http_listen, config.http_port, metrics, observe))
            log.info("serving /metrics and /observe on http://%s:%d", config.http_listen, self.http.port)
        self._add(ConfigWatcher(config_dir, config.profile_dir, lambda: request(RELOAD, "file change")))
        self._add(CpuHotplugWatcher(lambda: request(RELOAD, "CPU hotplug")))

    def _add(self, service):
        service.start()
        self._running.append(service)
        return service

    def stop(self) -> None:
        """Newest first; a failure is logged and the rest still stop."""
        for service in reversed(self._running):
            try:
                service.stop()
            except Exception as exc:  # keep going: restoring threads matters more
                log.warning("stopping %s: %s", type(service).__name__, exc)
        self._running.clear()
