"""The control socket's server: one thread per client, each request handed to its command's
handler, the reply sent back as one line (the protocol itself: temperd/control).

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
from typing import Any, Dict, NamedTuple, Optional

from temperd.control.protocol import (MAX_REQUEST, ControlError, Handler, LineReader, Progress, RequestTooLarge,
                                      encode_reply, error_reply, shown)
from temperd.observe.http import ACCEPT_STARVED
from temperd.text import printable
from temperd.wakeup import Wakeup

log = logging.getLogger("temperd.control")

MAX_CLIENTS = 16
BACKLOG = 128
REQUEST_TIMEOUT_S = 10.0  # from the connection (or the last reply) to a whole request line
SEND_TIMEOUT_S = 10.0  # for the client to take one reply line


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


def group_id(name: str) -> Optional[int]:
    """The group's id; None where there is no such group."""
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        return None


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


class _Server(socketserver.UnixStreamServer):
    """One thread per client, at most MAX_CLIENTS at once."""

    request_queue_size = BACKLOG

    def __init__(self, path: str, owner: "ControlServer"):
        self.owner = owner
        self._active = 0
        self._count = threading.Lock()
        super().__init__(path, _Client)

    def get_request(self):
        try:
            return super().get_request()
        except OSError as exc:
            if exc.errno in ACCEPT_STARVED:
                time.sleep(0.1)  # the client stays queued; do not spin on the readable listener
            raise

    def process_request(self, request, client_address) -> None:
        with self._count:
            busy = self._active >= self.owner.max_clients
            if not busy:
                self._active += 1
        if busy:
            _send_quietly(request, error_reply(f"temperd is busy: {self.owner.max_clients} clients are connected "
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


class _Client(socketserver.BaseRequestHandler):
    """One client of the control socket, served by its _Server's owner."""

    def handle(self) -> None:
        peer = Peer.of(self.request)
        if not _peer_allowed(peer, self.server.owner.gid):
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
            self._send(self.server.owner.dispatch(raw, lambda note: self._send({"progress": True, **note}), peer))

    def _send(self, reply: Dict[str, Any]) -> None:
        self.request.settimeout(SEND_TIMEOUT_S)
        self.request.sendall(encode_reply(reply))


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
        self.gid = group_id(group)  # None: no such group, root only
        self._server: Optional[_Server] = None
        self._thread: Optional[threading.Thread] = None
        self._wakeup = Wakeup()  # stop() wakes the accept loop, which otherwise sleeps until a client

    def bind(self) -> None:
        """Create the socket (clients queue until serve()). OSError naming the path when it cannot."""
        parent = os.path.dirname(self.path) or "."
        try:
            if os.path.lexists(parent) and not os.path.isdir(parent):
                raise NotADirectoryError(errno.ENOTDIR, f"{parent} is not a directory")
            os.makedirs(parent, exist_ok=True)
            if os.path.lexists(self.path):
                os.unlink(self.path)  # left by a crashed run; the daemon holds the single-instance lock
            self._server = _Server(self.path, self)
            os.chmod(self.path, 0o660)
            # Under the unit temperd runs with group temper, so the socket is born root:temper; chown
            # only where it differs: the unit's system call filter leaves chown out (@privileged).
            born = os.stat(self.path)
            if self.gid is not None and (born.st_uid, born.st_gid) != (0, self.gid):
                os.chown(self.path, 0, self.gid)
        except OSError as exc:
            raise OSError(exc.errno, f"cannot create the control socket {self.path}: {exc.strerror or exc}") from None

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
