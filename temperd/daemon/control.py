"""The control socket: a Unix stream socket speaking one JSON object per line.

A request is one line holding a JSON object {"cmd": NAME, ...} of at most MAX_REQUEST bytes.
Every reply is one line holding a JSON object: {"ok": true, ...} with the command's answer, or
{"ok": false, "error": TEXT}, TEXT being one line that says what was wrong and what was
expected. A line that is not JSON, not an object, too long, or names no command gets that error
reply like any other refusal; before its reply a long command (trace) may send progress lines
{"progress": true, ...}. A client may send several requests on one connection.

Privileged actions (reload, trace capture) only ever go over this socket, never over TCP.
Access is by file mode (0660, root and group `temper`), checked again with SO_PEERCRED.
Bounded: at most MAX_CLIENTS are served at once (one more is told so and closed), a request
must arrive within REQUEST_TIMEOUT_S and a reply be taken within SEND_TIMEOUT_S.
"""

from __future__ import annotations

import errno
import grp
import json
import logging
import os
import pwd
import selectors
import socket
import socketserver
import struct
import sys
import threading
import time
from typing import Any, Callable, Dict, NamedTuple, Optional

from temperd.text import printable
from temperd.wakeup import Wakeup

log = logging.getLogger("temperd.control")

Progress = Callable[[Dict[str, Any]], None]
# A handler gets the request and a function that sends {"progress": true, ...} lines before the reply.
Handler = Callable[[Dict[str, Any], Progress], Dict[str, Any]]
MAX_REQUEST = 64 * 1024
MAX_CLIENTS = 16
BACKLOG = 128
REQUEST_TIMEOUT_S = 10.0  # from the connection (or the last reply) to a whole request line
SEND_TIMEOUT_S = 10.0  # for the client to take one reply line
MAX_REPLY = 256 * 2**20  # what temperctl reads of one reply line
_NO_DESCRIPTORS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


def shown(value: Any, width: int = 40) -> str:
    """A value from a request, for an error message: its repr, one line, at most `width` characters."""
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def one_line(text: str, width: int = 1000) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[: width - 3] + "..."


def error_reply(text: str) -> Dict[str, Any]:
    return {"ok": False, "error": one_line(text)}


PID_MAX = 4194304  # the kernel's largest pid_max (PID_MAX_LIMIT): no PID or TID is above it


def task_id(value: Any, key: str = "id") -> int:
    """A PID or TID from a request: a JSON integer from 1 to PID_MAX (not a string, not true)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= PID_MAX:
        raise ControlError(f"{key}: expected a PID or TID, a whole number from 1 to {PID_MAX}; found {shown(value)}")
    return value


class Peer(NamedTuple):
    """Who is on the other end of a connection, as the kernel says (SO_PEERCRED); commands get it
    as request["peer"], which a client cannot set."""

    pid: int
    uid: int
    gid: int

    @staticmethod
    def of(sock: socket.socket) -> "Peer":
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        return Peer(*struct.unpack("3i", creds))

    def describe(self) -> str:
        try:
            name = f" ({pwd.getpwuid(self.uid).pw_name})"
        except KeyError:
            name = ""
        return f"uid {self.uid}{name} pid {self.pid}"


PEER = "peer"  # the request key dispatch() sets to the Peer, whatever the client sent there


def requester(request: Dict[str, Any]) -> str:
    """Who asked, for the log, a binding and a trace's notes: the kernel's word for the peer, then
    what the client says of itself (escaped, bounded), never the other way round."""
    peer = request.get(PEER)
    said = request.get("requester")
    who = peer.describe() if isinstance(peer, Peer) else "control socket"
    return f"{who} ({printable(said)[:200]})" if isinstance(said, str) and said else who


def _peer_allowed(peer: Peer, gid: Optional[int]) -> bool:
    if peer.uid == 0 or gid is None:
        return peer.uid == 0
    if peer.gid == gid:
        return True
    try:
        name = pwd.getpwuid(peer.uid).pw_name
        return name in grp.getgrgid(gid).gr_mem
    except KeyError:
        return False


class RequestTooLarge(Exception):
    pass


class LineReader:
    """Lines from a socket, each at most `limit` bytes, each within a deadline: a client can make
    temperd neither buffer more than that nor wait longer."""

    def __init__(self, sock: socket.socket, limit: int):
        self.sock, self.limit = sock, limit
        self._buffer = bytearray()
        self._eof = False

    def next_line(self, timeout: float) -> Optional[bytes]:
        """The next line (with its newline; the last one before EOF may have none); None at EOF.
        Raises RequestTooLarge, socket.timeout, OSError."""
        deadline = time.monotonic() + timeout
        while True:
            end = self._buffer.find(b"\n")
            if end > self.limit or (end < 0 and len(self._buffer) > self.limit):
                raise RequestTooLarge()
            if end >= 0 or (self._eof and self._buffer):
                end = end + 1 if end >= 0 else len(self._buffer)
                line = bytes(self._buffer[:end])
                del self._buffer[:end]
                return line
            if self._eof:
                return None
            left = deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout("no whole request in time")
            self.sock.settimeout(left)
            chunk = self.sock.recv(65536)
            if chunk:
                self._buffer += chunk
            else:
                self._eof = True


class _Server(socketserver.UnixStreamServer):
    """One thread per client, at most MAX_CLIENTS at once."""

    request_queue_size = BACKLOG

    def __init__(self, path: str, handler, max_clients: int):
        self.max_clients = max_clients
        self._active = 0
        self._count = threading.Lock()
        super().__init__(path, handler)

    def get_request(self):
        try:
            return super().get_request()
        except OSError as exc:
            if exc.errno in _NO_DESCRIPTORS:
                time.sleep(0.1)  # the client stays queued; do not spin on the readable listener
            raise

    def process_request(self, request, client_address) -> None:
        with self._count:
            busy = self._active >= self.max_clients
            if not busy:
                self._active += 1
        if busy:
            _send_quietly(request, error_reply(f"temperd is busy: {self.max_clients} clients are connected "
                                               "(the most it serves at once); try again"))
            self.shutdown_request(request)
            return
        try:
            threading.Thread(target=self._serve_one, args=(request, client_address), name="control",
                             daemon=True).start()
        except RuntimeError as exc:
            log.warning("cannot start a thread for a control client: %s", exc)
            self._release(request)

    def _serve_one(self, request, client_address) -> None:
        try:
            self.finish_request(request, client_address)
        except Exception:
            self.handle_error(request, client_address)
        finally:
            self._release(request)

    def _release(self, request) -> None:
        try:
            self.shutdown_request(request)
        finally:
            with self._count:
                self._active -= 1

    def handle_error(self, request, client_address) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, OSError):  # the client went away or was too slow: its own business
            log.debug("control client: %s", exc)
        else:
            log.exception("control client failed")


def _send_quietly(sock: socket.socket, reply: Dict[str, Any]) -> None:
    try:
        sock.settimeout(0.5)
        sock.sendall(json.dumps(reply).encode() + b"\n")
    except OSError:
        pass


class ControlServer:
    """Serves requests {"cmd": NAME, ...} by calling handlers[NAME](request) in a thread per client."""

    def __init__(self, path: str, handlers: Dict[str, Handler], group: str = "temper",
                 max_clients: int = MAX_CLIENTS):
        self.path = path
        self.handlers = handlers
        self.max_clients = max_clients
        try:
            self.gid: Optional[int] = grp.getgrnam(group).gr_gid
        except KeyError:
            self.gid = None  # no such group: root only
        self._server: Optional[_Server] = None
        self._thread: Optional[threading.Thread] = None
        self._wakeup = Wakeup()  # stop() wakes the accept loop, which otherwise sleeps until a client

    def bind(self) -> None:
        """Create the socket (clients queue until serve()). OSError naming the path when it cannot."""
        try:
            self._bind()
        except OSError as exc:
            raise OSError(exc.errno, f"cannot create the control socket {self.path}: {exc.strerror or exc}") from None

    def _bind(self) -> None:
        parent = os.path.dirname(self.path) or "."
        if os.path.lexists(parent) and not os.path.isdir(parent):
            raise NotADirectoryError(errno.ENOTDIR, f"{parent} is not a directory")
        os.makedirs(parent, exist_ok=True)
        if os.path.lexists(self.path):
            os.unlink(self.path)  # left by a crashed run; the daemon holds the single-instance lock
        self._server = _Server(self.path, self._handler_class(), self.max_clients)
        os.chmod(self.path, 0o660)
        # Under the unit temperd runs with group temper, so the socket is born root:temper; chown
        # only where it differs: the unit's system call filter leaves chown out (@privileged).
        born = os.stat(self.path)
        if self.gid is not None and (born.st_uid, born.st_gid) != (0, self.gid):
            os.chown(self.path, 0, self.gid)

    def serve(self) -> None:
        assert self._server is not None, "bind() first"
        self._wakeup.drain()  # an earlier stop()'s byte
        self._thread = threading.Thread(target=self._serve, args=(self._server,), name="control", daemon=True)
        self._thread.start()

    def _serve(self, server: "_Server") -> None:
        """Accept clients until stop(). Not socketserver's serve_forever: that wakes every
        poll_interval to look for a shutdown; this sleeps until a client or stop() comes."""
        with selectors.DefaultSelector() as selector:
            selector.register(server, selectors.EVENT_READ)
            selector.register(self._wakeup.fileno(), selectors.EVENT_READ)
            while True:
                ready = [key.fileobj for key, _mask in selector.select()]
                if self._wakeup.fileno() in ready:
                    return
                server.handle_request()

    def start(self) -> None:
        self.bind()
        self.serve()

    def _handler_class(self):
        outer = self

        class _Client(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                peer = Peer.of(self.request)
                if not _peer_allowed(peer, outer.gid):
                    self._send(error_reply("permission denied: root or group temper only"))
                    return
                lines = LineReader(self.request, MAX_REQUEST)
                while True:
                    try:
                        raw = lines.next_line(REQUEST_TIMEOUT_S)
                    except RequestTooLarge:
                        self._send(error_reply(f"request too large: more than {MAX_REQUEST} bytes without a "
                                               "newline; expected one JSON object per line"))
                        return
                    except socket.timeout:
                        _send_quietly(self.request, error_reply(f"no whole request line within "
                                                                f"{REQUEST_TIMEOUT_S:g} s; closing"))
                        return
                    if raw is None:
                        return
                    self._send(outer.dispatch(raw, lambda note: self._send({"progress": True, **note}), peer))

            def _send(self, reply: Dict[str, Any]) -> None:
                self.request.settimeout(SEND_TIMEOUT_S)
                self.request.sendall(_encode(reply))

        return _Client

    def dispatch(self, raw: bytes, progress: Progress = lambda note: None, peer: Optional[Peer] = None) -> Dict[str, Any]:
        """The reply to one request line; never raises. `peer`: who sent it (None: in-process)."""
        try:
            request = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            return error_reply(f"bad request: not JSON ({exc}); expected one JSON object per line, "
                               'e.g. {"cmd": "status"}')
        if not isinstance(request, dict):
            return error_reply(f'bad request: expected a JSON object such as {{"cmd": "status"}}, '
                               f"found {type(request).__name__} {shown(request)}")
        request[PEER] = peer
        cmd = request.get("cmd")
        handler = self.handlers.get(cmd) if isinstance(cmd, str) else None
        if handler is None:
            return error_reply(f"unknown command {shown(cmd)}; known: {', '.join(sorted(self.handlers))}")
        try:
            return {"ok": True, **handler(request, progress)}
        except ControlError as exc:
            return error_reply(str(exc))
        except OSError as exc:  # out of file descriptors, say: one line, not a traceback
            log.warning("control command %s: %s", cmd, exc)
            return error_reply(f"{cmd}: {exc.strerror or exc}")
        except Exception as exc:  # a bug must not take the daemon down through its socket
            log.exception("control command %s failed", cmd)
            return error_reply(f"internal error: {exc}")

    def stop(self) -> None:
        if self._server is not None:
            if self._thread is not None:
                self._wakeup.wake()
                self._thread.join()
                self._thread = None
            self._server.server_close()
            self._server = None
            try:
                os.unlink(self.path)
            except OSError:
                pass


def _encode(reply: Dict[str, Any]) -> bytes:
    try:
        return json.dumps(reply, default=str).encode() + b"\n"
    except (TypeError, ValueError, RecursionError) as exc:
        log.exception("control reply cannot be encoded")
        return json.dumps(error_reply(f"internal error: the reply cannot be encoded ({exc})")).encode() + b"\n"


class ControlError(Exception):
    """A request that cannot be served; the message goes back to temperctl."""


# ---- the client (temperctl) ----------------------------------------------------------------------


class DaemonUnavailable(Exception):
    """No answer could be had from temperd; the message, one line, says why."""


class DaemonNotRunning(DaemonUnavailable):
    """No temperd listens on the socket (none there, a stale one, or a path that cannot hold one)."""


class BadReply(DaemonUnavailable):
    """What came back is not a reply of this protocol."""


CONNECT_TIMEOUT_S = 5.0  # how long a full connection queue is waited out


def request(path: str, cmd: str, timeout: float = 30.0, on_progress: Optional[Callable[[dict], None]] = None,
            **args: Any) -> Dict[str, Any]:
    """Client side: send one request, return the final reply ({"ok": bool, ...}; an "error" line
    where ok is false). Replies with "progress": true are passed to on_progress and reading goes
    on. Raises DaemonUnavailable (DaemonNotRunning, BadReply) and nothing else of its own."""
    sock = _connect(path, min(timeout, CONNECT_TIMEOUT_S))
    with sock:
        sock.settimeout(timeout)
        refused: Optional[OSError] = None
        try:
            sock.sendall(json.dumps({"cmd": cmd, **args}).encode() + b"\n")
        except socket.timeout:
            raise DaemonUnavailable(f"temperd did not take the request within {timeout:g} s: it may be hung "
                                    "(systemctl status temperd)") from None
        except OSError as exc:  # closed on us: it may have said why first (busy, permission denied)
            refused = exc
        lines = LineReader(sock, MAX_REPLY)
        while True:
            try:
                line = lines.next_line(timeout)
            except socket.timeout:
                raise DaemonUnavailable(f"temperd did not answer within {timeout:g} s: it may be hung "
                                        "(systemctl status temperd)") from None
            except RequestTooLarge:
                raise BadReply(f"temperd's reply is larger than {MAX_REPLY >> 20} MiB") from None
            except OSError as exc:
                exc = refused or exc
                raise DaemonUnavailable(f"the connection to temperd failed: {exc.strerror or exc}") from None
            if line is None:
                if refused is not None:
                    raise DaemonUnavailable(f"temperd closed the connection: {refused.strerror or refused}")
                raise DaemonUnavailable("temperd closed the connection without a reply")
            reply = parse_reply(line)
            if reply.get("progress") is True:
                if on_progress is not None:
                    on_progress(reply)
                continue
            return reply


def parse_reply(line: bytes) -> Dict[str, Any]:
    """One reply line as the protocol says it is; BadReply otherwise."""
    if not line.endswith(b"\n"):
        raise BadReply("temperd's reply was cut off (the connection closed in the middle of it)")
    try:
        reply = json.loads(line)
    except (ValueError, RecursionError):
        raise BadReply(f"temperd's reply is not JSON: {shown(line)}") from None
    if not isinstance(reply, dict):
        raise BadReply(f"temperd's reply is not a JSON object: {shown(reply)}")
    if reply.get("progress") is True:
        return reply
    if not isinstance(reply.get("ok"), bool):
        raise BadReply(f"temperd's reply says neither ok nor failed: {shown(reply)}")
    if not reply["ok"]:
        error = reply.get("error")
        reply["error"] = one_line(error) if isinstance(error, str) and error.strip() else "request failed"
    return reply


def _connect(path: str, timeout: float) -> socket.socket:
    deadline = time.monotonic() + timeout
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(max(0.05, deadline - time.monotonic()))
        try:
            sock.connect(path)
            return sock
        except (BlockingIOError, InterruptedError, socket.timeout) as exc:
            sock.close()
            if time.monotonic() < deadline:  # the queue is full: wait for room
                time.sleep(0.05)
                continue
            raise DaemonUnavailable(f"temperd does not accept connections on {path} (its queue stayed full "
                                    f"for {timeout:g} s): it may be hung or overloaded") from exc
        except OSError as exc:
            sock.close()
            raise _connect_error(path, exc) from None


def _connect_error(path: str, exc: OSError) -> DaemonUnavailable:
    if isinstance(exc, FileNotFoundError):
        return DaemonNotRunning(f"temperd is not running (no control socket at {path})")
    if isinstance(exc, ConnectionRefusedError):
        return DaemonNotRunning(f"temperd is not running (nothing listens on {path})")
    if isinstance(exc, NotADirectoryError):
        return DaemonNotRunning(f"temperd is not running (no control socket at {path}: "
                                "part of the path is not a directory)")
    if isinstance(exc, PermissionError):
        return DaemonUnavailable(f"permission denied on {path}: run as root or as a member of group temper")
    return DaemonUnavailable(f"cannot connect to {path}: {exc.strerror or exc}")
