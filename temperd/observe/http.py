"""Read-only HTTP on loopback: GET /metrics (Prometheus text) and GET /observe (JSON)."""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Optional

log = logging.getLogger("temperd.http")

PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class HttpApi:
    def __init__(self, listen: str, port: int, metrics: Callable[[], bytes], observe: Callable[[], dict]):
        self.listen = listen
        self.requested_port = port
        self._metrics = metrics
        self._observe = observe
        self._server: Optional[ThreadingHTTPServer] = None
        self.port = port

    def start(self) -> None:
        api = self

        class Handler(BaseHTTPRequestHandler):
            server_version = "temperd"

            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                try:
                    if path == "/metrics":
                        self._reply(200, PROMETHEUS_CONTENT_TYPE, api._metrics())
                    elif path == "/observe":
                        body = json.dumps(api._observe(), default=str, indent=1).encode()
                        self._reply(200, "application/json", body)
                    else:
                        self._reply(404, "text/plain", b"not found: try /metrics or /observe\n")
                except Exception as exc:  # never let a request kill the server thread
                    log.exception("GET %s failed", path)
                    self._reply(500, "text/plain", f"internal error: {exc}\n".encode())

            def _refuse(self) -> None:
                self._reply(405, "text/plain", b"read-only: GET /metrics, GET /observe\n")

            do_POST = do_PUT = do_DELETE = do_PATCH = _refuse

            def _reply(self, code: int, ctype: str, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, fmt, *args) -> None:  # scrapes every few seconds: debug only
                log.debug("%s %s", self.address_string(), fmt % args)

        self._server = ThreadingHTTPServer((self.listen, self.requested_port), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, name="http", daemon=True).start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
