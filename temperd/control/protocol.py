"""The control protocol's shared part: its limits, its errors, the reply line and the request
helpers both sides use (package docstring: the wire format)."""

from __future__ import annotations

import json
import logging
import socket
import time
from typing import Any, Callable, Dict, Optional

log = logging.getLogger("temperd.control")

Progress = Callable[[Dict[str, Any]], None]
# A handler gets the request and a function that sends {"progress": true, ...} lines before the reply.
Handler = Callable[[Dict[str, Any], Progress], Dict[str, Any]]
MAX_REQUEST = 64 * 1024
MAX_REPLY = 256 * 2**20  # what temperctl reads of one reply line


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


class ControlError(Exception):
    """A request that cannot be served; the message goes back to temperctl."""


class DaemonUnavailable(Exception):
    """No answer could be had from temperd; the message, one line, says why."""


class DaemonNotRunning(DaemonUnavailable):
    """No temperd listens on the socket (none there, a stale one, or a path that cannot hold one)."""


class BadReply(DaemonUnavailable):
    """What came back is not a reply of this protocol."""


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


def encode_reply(reply: Dict[str, Any]) -> bytes:
    try:
        return json.dumps(reply, default=str).encode() + b"\n"
    except (TypeError, ValueError, RecursionError) as exc:
        log.exception("control reply cannot be encoded")
        return json.dumps(error_reply(f"internal error: the reply cannot be encoded ({exc})")).encode() + b"\n"


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
