"""The threads that serve and watch, started once temperd runs and stopped before it restores:
the control socket, HTTP (/metrics, /observe), the configuration watcher and the CPU hotplug
watcher. The watchers only ask the main loop for a reload.

The sockets are bound (bind) before temperd changes anything, so that a port or path it cannot
have stops the start while the host is still untouched; they are served (serve) once the first
plan is applied. A reload may move HTTP to another address (move_http)."""

from __future__ import annotations

import logging
from typing import Any, Callable, Dict, List, Optional

from temperd.config.daemon_config import DaemonConfig
from temperd.daemon.control import ControlServer
from temperd.control.protocol import Handler
from temperd.daemon.main_loop import RELOAD
from temperd.observe.http import HttpApi
from temperd.sources.watch import ConfigWatcher, CpuHotplugWatcher

log = logging.getLogger("temperd")


class Services:
    def __init__(self) -> None:
        self.http: Optional[HttpApi] = None
        self.control: Optional[ControlServer] = None
        self._running: List[Any] = []  # bound or started, oldest first
        self._metrics: Optional[Callable[[], bytes]] = None
        self._observe: Optional[Callable[[], dict]] = None

    def bind(self, config: DaemonConfig, handlers: Dict[str, Handler], metrics: Callable[[], bytes],
             observe: Callable[[], dict]) -> None:
        """Create the control socket and the HTTP listener; clients wait until serve().
        handlers: the control socket's commands; metrics, observe: the HTTP bodies. OSError
        (its message names the path or address) when one cannot be had."""
        self._metrics, self._observe = metrics, observe
        self.control = ControlServer(config.control_socket, handlers, config.control_group)
        self._running.append(self.control)  # stop() removes whatever part of it was made
        self.control.bind()
        if config.http_port:
            http = HttpApi(config.http_listen, config.http_port, metrics, observe)
            try:
                http.bind()
            except OSError as exc:
                raise OSError(exc.errno, f"{exc.strerror} ([http] listen and port in {config.source}, "
                                         f"or --http-port)") from None
            self.http = http
            self._running.append(http)

    def serve(self, config: DaemonConfig, config_dir: str, request: Callable[[str, str], None]) -> None:
        """Start the watchers, then serve what bind() made (clients last: nothing they do can
        make a watcher fail to start); request(kind, trigger): ask the main loop."""
        assert self.control is not None, "bind() first"
        self._add(ConfigWatcher(config_dir, config.profile_dir, lambda: request(RELOAD, "file change")))
        self._add(CpuHotplugWatcher(lambda: request(RELOAD, "CPU hotplug")))
        self.control.serve()
        if self.http is not None:
            self.http.serve()
            log.info("serving /metrics and /observe on http://%s", self.http.address)

    def move_http(self, listen: str, port: int) -> None:
        """Serve HTTP on listen:port from now on (port 0: not at all). OSError, its message naming
        the address, when the new one cannot be had: the old listener then keeps serving."""
        old = self.http
        unchanged = (old.listen, old.requested_port) == (listen, port) if old is not None else not port
        if unchanged:
            return
        new = None
        if port:
            assert self._metrics is not None and self._observe is not None, "bind() first"
            new = HttpApi(listen, port, self._metrics, self._observe)
            try:
                new.bind()
            except OSError:
                if old is None or old.port != port:
                    raise
                self._rebind_same_port(old, new)
            new.serve()
        if old is not None:
            old.stop()
            self._running.remove(old)
        self.http = new
        if new is not None:
            self._running.append(new)
            log.info("serving /metrics and /observe on http://%s%s", new.address,
                     f" (was http://{old.address})" if old is not None else "")
        elif old is not None:
            log.info("no longer serving HTTP on http://%s ([http] port = 0)", old.address)

    def _rebind_same_port(self, old: HttpApi, new: HttpApi) -> None:
        """The same port on another address of this host (127.0.0.1 to 0.0.0.0, say) conflicts
        with the old listener: let go of it first, and take it back if the new one fails too."""
        old.stop()
        try:
            new.bind()
        except OSError as exc:
            try:
                old.bind()
                old.serve()
            except OSError as lost:
                self._running.remove(old)
                self.http = None
                raise OSError(exc.errno, f"{exc.strerror}; and http://{old.address} could not be taken back "
                                         f"({lost.strerror}): HTTP is off until a reload or restart") from None
            raise

    def _add(self, service) -> None:
        service.start()
        self._running.append(service)

    def stop(self) -> None:
        """Newest first; a failure is logged and the rest still stop."""
        for service in reversed(self._running):
            try:
                service.stop()
            except Exception as exc:  # keep going: restoring threads matters more
                log.warning("stopping %s: %s", type(service).__name__, exc)
        self._running.clear()
        self.http = None
        self.control = None
