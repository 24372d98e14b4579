"""The control socket: a Unix stream socket speaking one JSON object per line.

Privileged actions (reload, trace capture) only ever go over this socket, never over TCP.
Access is by file mode (0660, root and group `temper`), checked again with SO_PEERCRED.
"""

from __future__ import annotations

import grp
import json
import logging
import os
import socket
import socketserver
import struct
import threading
from typing import Any, Callable, Dict, Optional

log = logging.getLogger("temperd.control")

Progress = Callable[[Dict[str, Any]], None]
# A handler gets the request and a function that sends {"progress": true, ...} lines before the reply.
Handler = Callable[[Dict[str, Any], Progress], Dict[str, Any]]
MAX_REQUEST = 64 * 1024


def _peer_allowed(sock: socket.socket, gid: Optional[int]) -> bool:
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, peer_gid = struct.unpack("3i", creds)
    if uid == 0 or gid is None:
        return uid == 0
    if peer_gid == gid:
        return True
    try:
        import pwd

        name = pwd.getpwuid(uid).pw_name
        return name in grp.getgrgid(gid).gr_mem
    except KeyError:
        return False


class ControlServer:
    """Serves requests {"cmd": NAME, ...} by calling handlers[NAME](request) in a thread per client."""

    def __init__(self, path: str, handlers: Dict[str, Handler], group: str = "temper"):
        self.path = path
        self.handlers = handlers
        try:
            self.gid: Optional[int] = grp.getgrnam(group).gr_gid
        except KeyError:
            self.gid = None  # no such group: root only
        self._server: Optional[socketserver.ThreadingUnixStreamServer] = None
        self._thread: Optional[threading.Thread] = None

    def start(self) -> None:
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        if os.path.exists(self.path):
            os.unlink(self.path)  # left by a crashed run; the daemon holds the single-instance lock
        outer = self

        class _Request(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                if not _peer_allowed(self.connection, outer.gid):
                    self._send({"ok": False, "error": "permission denied: root or group temper only"})
                    return
                for raw in self.rfile:
                    if len(raw) > MAX_REQUEST:
                        self._send({"ok": False, "error": "request too large"})
                        return
                    self._send(outer.dispatch(raw, lambda note: self._send({"progress": True, **note})))

            def _send(self, reply: Dict[str, Any]) -> None:
                self.wfile.write(json.dumps(reply, default=str).encode() + b"\n")
                self.wfile.flush()

        self._server = socketserver.ThreadingUnixStreamServer(self.path, _Request)
        self._server.daemon_threads = True
        os.chmod(self.path, 0o660)
        # Under the unit temperd runs with group temper, so the socket is born root:temper; chown
        # only where it differs: the unit's system call filter leaves chown out (@privileged).
        born = os.stat(self.path)
        if self.gid is not None and (born.st_uid, born.st_gid) != (0, self.gid):
            os.chown(self.path, 0, self.gid)
        self._thread = threading.Thread(target=self._server.serve_forever, name="control", daemon=True)
        self._thread.start()

    def dispatch(self, raw: bytes, progress: Progress = lambda note: None) -> Dict[str, Any]:
        try:
            request = json.loads(raw)
            if not isinstance(request, dict):
                raise ValueError("expected a JSON object")
        except ValueError as exc:
            return {"ok": False, "error": f"bad request: {exc}"}
        handler = self.handlers.get(str(request.get("cmd")))
        if handler is None:
            return {"ok": False, "error": f"unknown command {request.get('cmd')!r}; known: {', '.join(sorted(self.handlers))}"}
        try:
            return {"ok": True, **handler(request, progress)}
        except ControlError as exc:
            return {"ok": False, "error": str(exc)}
        except Exception as exc:  # a bug must not take the daemon down through its socket
            log.exception("control command %s failed", request.get("cmd"))
            return {"ok": False, "error": f"internal error: {exc}"}

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        try:
            os.unlink(self.path)
        except OSError:
            pass


class ControlError(Exception):
    """A request that cannot be served; the message goes back to temperctl."""


class DaemonUnavailable(Exception):
    pass


def request(path: str, cmd: str, timeout: float = 30.0, on_progress: Optional[Callable[[dict], None]] = None,
            **args: Any) -> Dict[str, Any]:
    """Client side: send one request, return the final reply. Replies with "progress": true are
    passed to on_progress and reading goes on."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(path)
    except FileNotFoundError:
        raise DaemonUnavailable(f"temperd is not running (no control socket at {path})") from None
    except ConnectionRefusedError:
        raise DaemonUnavailable(f"temperd is not running (nothing listens on {path})") from None
    except PermissionError:
        raise DaemonUnavailable(f"permission denied on {path}: run as root or as a member of group temper") from None
    with sock, sock.makefile("rwb") as stream:
        stream.write(json.dumps({"cmd": cmd, **args}).encode() + b"\n")
        stream.flush()
        for line in stream:
            reply = json.loads(line)
            if reply.get("progress") and on_progress is not None:
                on_progress(reply)
                continue
            return reply
    raise DaemonUnavailable("temperd closed the connection without a reply")
