"""The netlink process events connector (NETLINK_CONNECTOR, CN_IDX_PROC).

The kernel multicasts one message per fork/clone, exec, comm change and exit to every socket
subscribed with PROC_CN_MCAST_LISTEN. Subscribing needs CAP_NET_ADMIN and the initial pid and
user namespaces; elsewhere the kernel refuses (EPERM) or stays silent, and `open()` raises
ConnectorUnavailable with the reason. When the socket's receive buffer overflows, recv fails
once with ENOBUFS: an unknown number of events is lost, reported as `Batch.overflowed`, and the
caller must rescan /proc. The wire format is proc_wire's.
"""

from __future__ import annotations

import errno
import os
import random
import select
import socket
import struct
import time
from typing import List, Optional

from temperd.sources.proc_wire import (  # noqa: F401  (names this module has always offered)
    _CN_MSG, _DATA_OFFSET, _NLMSGHDR, _WANTED_NAMES, CN_IDX_PROC, CN_VAL_PROC, FILTER_SINCE, NETLINK_CONNECTOR,
    NLMSG_DONE, NLMSG_ERROR, NLMSG_NOOP, NLMSG_OVERRUN, ONE_EVENT_SIZE, PROC_CN_MCAST_IGNORE, PROC_CN_MCAST_LISTEN,
    PROC_EVENT_COMM, PROC_EVENT_EXEC, PROC_EVENT_EXIT, PROC_EVENT_FORK, PROC_EVENT_NONE, WANTED_EVENTS, Batch,
    ProcEvent, _control_message, decode_datagram, decode_event, decode_single, kernel_release)

# Default receive buffer: the kernel's default (~200 KiB) holds only a few hundred events, which a
# burst of short-lived processes fills in milliseconds.
DEFAULT_RCVBUF = 4 << 20
RECV_SIZE = 65536


class ConnectorUnavailable(Exception):
    """Process events cannot be had on this host; the message says why in one line."""


class ProcConnector:
    """A subscribed process-events socket. Not thread-safe; one per inventory."""

    def __init__(self, rcvbuf_bytes: int = DEFAULT_RCVBUF):
        self.rcvbuf_bytes = rcvbuf_bytes
        self.filter = "none"  # which event types the kernel delivers to this socket, said for status
        self._filtered = False
        self._sock: Optional[socket.socket] = None
        self._pending: List[ProcEvent] = []
        self._overflow_pending = False
        self._buffer = bytearray(RECV_SIZE)  # each datagram is read into it: no allocation per event

    def fileno(self) -> int:
        if self._sock is None:
            raise ValueError("process events socket is not open")
        return self._sock.fileno()

    def open(self, ack_timeout_s: float = 1.0) -> None:
        """Open, bind to the proc group and subscribe; raises ConnectorUnavailable."""
        if self._sock is not None:
            return
        try:
            sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_CONNECTOR)
        except OSError as exc:
            raise ConnectorUnavailable(f"cannot open a NETLINK_CONNECTOR socket: {os.strerror(exc.errno)}") from None
        try:
            self._set_rcvbuf(sock)
            sock.bind((0, CN_IDX_PROC))  # port id 0: the kernel assigns a unique one
            self._subscribe(sock, ack_timeout_s)
        except OSError as exc:
            sock.close()
            if exc.errno in (errno.EPERM, errno.EACCES):
                raise ConnectorUnavailable("subscribing to process events needs CAP_NET_ADMIN") from None
            raise ConnectorUnavailable(f"subscribing to process events failed: {os.strerror(exc.errno)}") from None
        except ConnectorUnavailable:
            sock.close()
            raise
        sock.setblocking(False)
        self._sock = sock

    def _subscribe(self, sock: socket.socket, ack_timeout_s: float) -> None:
        """LISTEN, acknowledged; then, where the kernel has it, LISTEN again with the event-type
        filter. That one is not acknowledged: the kernel sends its ack through the socket's new
        filter, which drops it (an ack is no event type). A kernel that ignores the longer message
        keeps sending every type: drain() then says the filter is not in force."""
        cookie = random.randrange(1, 1 << 31)
        sock.send(_control_message(PROC_CN_MCAST_LISTEN, cookie))
        self._wait_for_ack(sock, cookie, ack_timeout_s)
        release = kernel_release()
        if release < FILTER_SINCE:
            self.filter = (f"none: Linux {release[0]}.{release[1]} has no event-type filter (since "
                           f"{FILTER_SINCE[0]}.{FILTER_SINCE[1]}); every event type delivered")
        else:
            sock.send(_control_message(PROC_CN_MCAST_LISTEN, random.randrange(1, 1 << 31), WANTED_EVENTS))
            self.filter = f"kernel filter: {_WANTED_NAMES} only"
            self._filtered = True

    def _unfiltered(self, event: ProcEvent) -> None:
        """An event the filter keeps out arrived: the kernel did not take the filter."""
        self._filtered = False
        self.filter = (f"none: the kernel ignored the event-type filter (a {event.what:#x} event came); "
                       "every event type delivered")

    def _set_rcvbuf(self, sock: socket.socket) -> None:
        if not self.rcvbuf_bytes:
            return
        # SO_RCVBUFFORCE (root) ignores net.core.rmem_max; without it the size is capped.
        force = getattr(socket, "SO_RCVBUFFORCE", 33)
        try:
            sock.setsockopt(socket.SOL_SOCKET, force, self.rcvbuf_bytes)
        except OSError:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.rcvbuf_bytes)

    def _wait_for_ack(self, sock: socket.socket, cookie: int, timeout_s: float) -> None:
        """The kernel answers LISTEN with an ack whose cn_msg.ack is our cookie + 1.

        Events that other listeners' traffic brings in first are kept for the first drain. No ack
        at all means the kernel ignored us (another pid or user namespace) or refused silently.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ConnectorUnavailable(
                    "the kernel did not acknowledge the process events subscription "
                    "(not in the initial pid/user namespace, or lacking CAP_NET_ADMIN)"
                )
            readable, _, _ = select.select([sock], [], [], remaining)
            if not readable:
                continue
            try:
                data = sock.recv(RECV_SIZE)
            except OSError as exc:
                if exc.errno == errno.ENOBUFS:
                    self._overflow_pending = True
                    continue
                raise
            offset = 0
            while offset + _DATA_OFFSET <= len(data):
                length = struct.unpack_from("=I", data, offset)[0]
                if length < _NLMSGHDR.size:
                    break
                event = decode_event(data, offset)
                if event is not None and event.kind == "ack":
                    cack = _CN_MSG.unpack_from(data, offset + _NLMSGHDR.size)[3]
                    if cack == cookie + 1:
                        if event.exit_code:
                            raise OSError(event.exit_code, os.strerror(event.exit_code))
                        return
                elif event is not None:
                    self._pending.append(event)
                offset += (length + 3) & ~3

    def drain(self, max_events: int = 100000) -> Batch:
        """Every event queued now, without blocking (at most max_events; the rest stay queued)."""
        batch = Batch(events=self._pending, overflowed=self._overflow_pending)
        self._pending = []
        self._overflow_pending = False
        sock = self._sock
        if sock is None:
            return batch
        events = batch.events
        append, recv_into, data = events.append, sock.recv_into, self._buffer
        while len(events) < max_events:
            try:
                size = recv_into(data)
            except BlockingIOError:
                break
            except InterruptedError:
                continue
            except OSError as exc:
                if exc.errno == errno.ENOBUFS:
                    batch.overflowed = True
                    continue
                raise
            if size == ONE_EVENT_SIZE:  # what the kernel sends: one wanted event alone
                event = decode_single(data)
                if event is not None:
                    append(event)
                    continue
            elif not size:
                break
            for event in decode_datagram(bytes(data[:size])):
                if event.kind != "ack":
                    events.append(event)
                    if self._filtered and not event.what & WANTED_EVENTS:
                        self._unfiltered(event)
        return batch

    def close(self) -> None:
        """Unsubscribe (the kernel counts listeners and keeps generating events while any remain)."""
        sock = self._sock
        if sock is None:
            return
        self._sock = None
        try:
            sock.send(_control_message(PROC_CN_MCAST_IGNORE, random.randrange(1, 1 << 31)))
        except OSError:
            pass
        sock.close()
