"""The control socket's client: one request, its progress lines, the final reply (temperctl)."""

from __future__ import annotations

import json
import socket
import time
from typing import Any, Callable, Dict, Optional

from temperd.control.protocol import (MAX_REPLY, BadReply, DaemonNotRunning, DaemonUnavailable, LineReader,
                                      RequestTooLarge, parse_reply)

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
