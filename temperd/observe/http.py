"""Read-only HTTP on loopback: GET /metrics (Prometheus text) and GET /observe (JSON).

Any local user may connect, so what one can hold is bounded. At most MAX_CONNECTIONS
connections are open at once, each served on a thread of its own; further ones are not
accepted but wait in the kernel's listen backlog (BACKLOG), where they cost temperd no file
descriptor, and beyond that the kernel refuses them. A client has REQUEST_TIMEOUT_S from the
moment it is accepted to send its request line and headers, and SEND_TIMEOUT_S to take the
reply; then it is dropped. One request per connection (HTTP/1.0).
"""

from __future__ import annotations

import errno
import json
import logging
import select
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler
from typing import Callable, Optional, Tuple

from temperd.files import OUT_OF_DESCRIPTORS
from temperd.wakeup import Wakeup

log = logging.getLogger("temperd.http")

PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

MAX_CONNECTIONS = 32  # open at once; scrapers come one at a time and /observe takes the daemon's lock
BACKLOG = 1024  # the kernel caps it at net.core.somaxconn
REQUEST_TIMEOUT_S = 5.0  # request line and headers, from the accept
SEND_TIMEOUT_S = 10.0  # the whole reply
_FULL_RETRY_S = 0.25  # with every connection slot taken, how often the accept loop looks again
ACCEPT_STARVED = (*OUT_OF_DESCRIPTORS, errno.ENOBUFS, errno.ENOMEM)  # accept() out of descriptors or memory
_WARN_EVERY_S = 60.0


class _DeadlineReader:
    """The request's reader: every read waits only for what is left of one deadline, so a client
    that sends a byte now and then cannot hold its connection past REQUEST_TIMEOUT_S."""

    def __init__(self, raw, sock: socket.socket, deadline: float):
        self._raw, self._sock, self._deadline = raw, sock, deadline

    def _arm(self) -> None:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise socket.timeout("the request did not arrive in time")
        self._sock.settimeout(left)

    def readline(self, size: int = -1) -> bytes:
        self._arm()
        return self._raw.readline(size)

    def read(self, size: int = -1) -> bytes:
        self._arm()
        return self._raw.read(size)

    def close(self) -> None:
        self._raw.close()


def format_address(listen: str, port: int) -> str:
    """host:port, with an IPv6 address in brackets."""
    return f"[{listen}]:{port}" if ":" in listen else f"{listen}:{port}"


class HttpApi:
    def __init__(self, listen: str, port: int, metrics: Callable[[], bytes], observe: Callable[[], dict],
                 max_connections: int = MAX_CONNECTIONS):
        self.listen = listen
        self.requested_port = port
        self._metrics = metrics
        self._observe = observe
        self.max_connections = max_connections
        self.port = port
        self._listener: Optional[socket.socket] = None
        self._thread: Optional[threading.Thread] = None
        self._stopping = threading.Event()
        self._wakeup = Wakeup()  # stop() wakes the accept loop, which otherwise sleeps until a client
        self._slots = threading.BoundedSemaphore(max_connections)
        self._open = 0
        self._open_lock = threading.Lock()
        self._warned_at = -_WARN_EVERY_S

    @property
    def address(self) -> str:
        return format_address(self.listen, self.port)

    @property
    def open_connections(self) -> int:
        with self._open_lock:
            return self._open

    # ---- lifecycle ----------------------------------------------------------------------------

    def bind(self) -> None:
        """Bind and listen (connections queue in the backlog until serve()). OSError when the
        address cannot be had: the message names it."""
        family = socket.AF_INET6 if ":" in self.listen else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((self.listen, self.requested_port))
            listener.listen(BACKLOG)
        except OSError as exc:
            listener.close()
            raise OSError(exc.errno, f"cannot listen on {format_address(self.listen, self.requested_port)}: "
                                     f"{exc.strerror or exc}") from None
        self._listener = listener
        self.port = listener.getsockname()[1]

    def serve(self) -> None:
        assert self._listener is not None, "bind() first"
        self._stopping.clear()
        self._wakeup.drain()  # an earlier stop()'s byte
        self._thread = threading.Thread(target=self._accept_loop, args=(self._listener,), name="http", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop accepting and close the listener; requests under way finish on their threads."""
        self._stopping.set()
        self._wakeup.wake()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._listener is not None:
            self._listener.close()
            self._listener = None

    # ---- connections --------------------------------------------------------------------------

    def _accept_loop(self, listener: socket.socket) -> None:
        poller = select.poll()
        poller.register(listener, select.POLLIN)
        poller.register(self._wakeup.fileno(), select.POLLIN)
        while not self._stopping.is_set():
            if not self._slots.acquire(timeout=_FULL_RETRY_S):
                self._warn(f"{self.max_connections} HTTP connections open (the most served at once); "
                           f"more wait in the listen backlog")
                continue
            conn = self._accept(listener, poller)
            if conn is None:
                self._slots.release()
                continue
            with self._open_lock:
                self._open += 1
            try:
                threading.Thread(target=self._serve_one, args=conn, name="http", daemon=True).start()
            except RuntimeError as exc:  # no thread to be had: drop this one, keep serving
                log.warning("cannot start a thread for an HTTP request: %s", exc)
                self._done(conn[0])

    def _accept(self, listener: socket.socket, poller) -> Optional[Tuple[socket.socket, tuple]]:
        ready = [fd for fd, _events in poller.poll()]  # no timeout: a client or stop() wakes it
        if listener.fileno() not in ready:
            return None
        try:
            conn, address = listener.accept()
        except OSError as exc:
            if exc.errno in ACCEPT_STARVED:
                # The connection stays in the backlog; try again once something was closed.
                self._warn(f"cannot accept an HTTP connection: {exc.strerror}")
                self._stopping.wait(_FULL_RETRY_S)
            return None  # ECONNABORTED and the like: that client is gone
        return conn, address

    def _serve_one(self, conn: socket.socket, address: tuple) -> None:
        try:
            _Handler(conn, address, self)
        except OSError as exc:  # timed out, reset, or went away before the reply: its own business
            log.debug("HTTP client %s: %s", address[0], exc)
        except Exception:  # a bug: the connection is dropped, the server goes on
            log.exception("HTTP request from %s failed", address[0])
        finally:
            self._done(conn)

    def _done(self, conn: socket.socket) -> None:
        try:
            conn.close()
        finally:
            with self._open_lock:
                self._open -= 1
            self._slots.release()

    def _warn(self, message: str) -> None:
        now = time.monotonic()
        if now - self._warned_at >= _WARN_EVERY_S:
            self._warned_at = now
            log.warning("%s (logged at most once a minute)", message)


class _Handler(BaseHTTPRequestHandler):
    """One request; `server` is the HttpApi that accepted it."""

    server_version = "temperd"
    timeout = None  # setup() arms the deadline

    def setup(self) -> None:
        super().setup()
        self.rfile = _DeadlineReader(self.rfile, self.connection, time.monotonic() + REQUEST_TIMEOUT_S)

    def do_GET(self) -> None:
        api = self.server
        self.connection.settimeout(SEND_TIMEOUT_S)
        path = self.path.split("?", 1)[0]
        try:
            if path == "/metrics":
                reply = 200, PROMETHEUS_CONTENT_TYPE, api._metrics()
            elif path == "/observe":
                reply = 200, "application/json", json.dumps(api._observe(), default=str, indent=1).encode()
            else:
                reply = 404, "text/plain", b"not found: try /metrics or /observe\n"
        except OSError as exc:  # out of file descriptors, say: not a bug, and it passes
            api._warn(f"GET {path}: {exc.strerror or exc}")
            reply = 503, "text/plain", f"unavailable: {exc.strerror or exc}\n".encode()
        except Exception as exc:  # never let a request kill the server thread
            log.exception("GET %s failed", path)
            reply = 500, "text/plain", f"internal error: {exc}\n".encode()
        self._reply(*reply)

    def _refuse(self) -> None:
        self.connection.settimeout(SEND_TIMEOUT_S)
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
