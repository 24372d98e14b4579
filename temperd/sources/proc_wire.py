"""The netlink process events connector's wire format (linux/netlink.h, linux/connector.h,
linux/cn_proc.h), native byte order; sources/proc_connector.py holds the socket.

  nlmsghdr   len u32, type u16, flags u16, seq u32, pid u32             16 bytes
  cn_msg     idx u32, val u32, seq u32, ack u32, len u16, flags u16     20 bytes
  proc_event what u32, cpu u32, timestamp_ns u64, then the event data
"""

from __future__ import annotations

import os
import re
import struct
from dataclasses import dataclass, field
from typing import List, NamedTuple, Optional, Tuple

NETLINK_CONNECTOR = 11
CN_IDX_PROC = 1
CN_VAL_PROC = 1

NLMSG_NOOP = 1
NLMSG_ERROR = 2
NLMSG_DONE = 3
NLMSG_OVERRUN = 4

PROC_CN_MCAST_LISTEN = 1
PROC_CN_MCAST_IGNORE = 2

PROC_EVENT_NONE = 0x00000000
PROC_EVENT_FORK = 0x00000001
PROC_EVENT_EXEC = 0x00000002
PROC_EVENT_COMM = 0x00000200
PROC_EVENT_EXIT = 0x80000000

_NLMSGHDR = struct.Struct("=IHHII")
_CN_MSG = struct.Struct("=IIIIHH")
_EVENT_HEAD = struct.Struct("=IIQ")
_FORK = struct.Struct("=iiii")  # parent_pid, parent_tgid, child_pid, child_tgid
_PID_TGID = struct.Struct("=ii")  # exec, and the head of comm/exit
_COMM = struct.Struct("=ii16s")
_EXIT = struct.Struct("=iiII")  # pid, tgid, exit_code, exit_signal
_ACK = struct.Struct("=I")

# Linux 6.6 takes, with PROC_CN_MCAST_LISTEN, a mask of the event types a socket wants
# (struct proc_input { mcast_op; event_type; }); older kernels drop a message of that size. temperd needs forks (new threads of tracked processes, their children), execs,
# renames and exits (ended threads leave the plan); the filter keeps out the rest (setuid,
# setgid, setsid, ptrace and core dump events), which the kernel otherwise sends to every listener.
FILTER_SINCE = (6, 6)
WANTED_EVENTS = PROC_EVENT_FORK | PROC_EVENT_EXEC | PROC_EVENT_COMM | PROC_EVENT_EXIT
_WANTED_NAMES = "fork, exec, comm, exit"

_EVENT_OFFSET = _NLMSGHDR.size + _CN_MSG.size
_DATA_OFFSET = _EVENT_OFFSET + _EVENT_HEAD.size
_HEAD = struct.Struct("=" + "".join(part.format.lstrip("=") for part in (_NLMSGHDR, _CN_MSG, _EVENT_HEAD)))  # all three at once
# The kernel sends each event alone in a datagram of this size (struct proc_event is the size of
# its largest union member). Such a datagram is read with one unpack (decode_single): nlmsg_type,
# cn_msg idx and val, what, cpu, timestamp and the union's first four words (fork: parent tid and
# tgid, child tid and tgid; exec, comm, exit: tid and tgid, then exit's code and signal).
ONE_EVENT_SIZE = _DATA_OFFSET + 24
_SINGLE = struct.Struct("=4xH10xII12xIIQiiIi")
_COMM_NAME = struct.Struct("=16s")
_new = tuple.__new__



class ProcEvent(NamedTuple):
    """One decoded process event. `pid` is the thread group (process) id, `tid` the thread's.
    A tuple: a fork storm brings thousands a second, and a frozen dataclass costs several times
    as much to make."""

    kind: str  # "fork" | "exec" | "comm" | "exit" | "ack" | "other"
    tid: int
    pid: int
    timestamp_ns: int  # CLOCK_MONOTONIC, comparable with time.monotonic_ns()
    cpu: int
    parent_tid: int = 0  # fork: the task that cloned
    parent_pid: int = 0
    comm: Optional[str] = None  # comm: the new name
    exit_code: int = 0  # exit: wait status; ack: the error number
    what: int = 0  # the raw event type


@dataclass
class Batch:
    """What one drain of the socket returned."""

    events: List[ProcEvent] = field(default_factory=list)
    overflowed: bool = False  # ENOBUFS: events were lost; rescan /proc


def decode_event(data: bytes, offset: int = 0) -> Optional[ProcEvent]:
    """Decode the proc_event carried by the netlink message at `offset`; None if it is not one."""
    if len(data) < offset + _DATA_OFFSET:
        return None
    (_len, nl_type, _flags, _seq, _pid, idx, val, _cseq, _ack, _clen, _cflags,
     what, cpu, timestamp) = _HEAD.unpack_from(data, offset)
    if nl_type in (NLMSG_NOOP, NLMSG_ERROR, NLMSG_OVERRUN):
        return None
    if idx != CN_IDX_PROC or val != CN_VAL_PROC:
        return None
    at = offset + _DATA_OFFSET
    if what == PROC_EVENT_FORK:
        parent_tid, parent_pid, child_tid, child_pid = _FORK.unpack_from(data, at)
        return ProcEvent("fork", child_tid, child_pid, timestamp, cpu, parent_tid, parent_pid, what=what)
    if what == PROC_EVENT_EXEC:
        tid, pid = _PID_TGID.unpack_from(data, at)
        return ProcEvent("exec", tid, pid, timestamp, cpu, what=what)
    if what == PROC_EVENT_COMM:
        tid, pid, raw = _COMM.unpack_from(data, at)
        comm = raw.split(b"\0", 1)[0].decode("utf-8", "replace")
        return ProcEvent("comm", tid, pid, timestamp, cpu, comm=comm, what=what)
    if what == PROC_EVENT_EXIT:
        tid, pid, code, _signal = _EXIT.unpack_from(data, at)
        return ProcEvent("exit", tid, pid, timestamp, cpu, exit_code=code, what=what)
    if what == PROC_EVENT_NONE:
        (err,) = _ACK.unpack_from(data, at)
        return ProcEvent("ack", 0, 0, timestamp, cpu, exit_code=err, what=what)
    tid, pid = _PID_TGID.unpack_from(data, at)
    return ProcEvent("other", tid, pid, timestamp, cpu, what=what)


def decode_single(data: bytes) -> Optional[ProcEvent]:
    """A datagram of ONE_EVENT_SIZE bytes holding a fork, exec, comm or exit event, decoded as
    decode_event would; None for anything else (decode_datagram then reads it)."""
    nl_type, idx, val, what, cpu, timestamp, a, b, c, d = _SINGLE.unpack_from(data)
    if idx != CN_IDX_PROC or val != CN_VAL_PROC or nl_type in (NLMSG_NOOP, NLMSG_ERROR, NLMSG_OVERRUN):
        return None
    if what == PROC_EVENT_FORK:
        return _new(ProcEvent, ("fork", c, d, timestamp, cpu, a, b, None, 0, what))
    if what == PROC_EVENT_EXEC:
        return _new(ProcEvent, ("exec", a, b, timestamp, cpu, 0, 0, None, 0, what))
    if what == PROC_EVENT_EXIT:
        return _new(ProcEvent, ("exit", a, b, timestamp, cpu, 0, 0, None, c, what))
    if what == PROC_EVENT_COMM:
        comm = _COMM_NAME.unpack_from(data, _DATA_OFFSET + 8)[0].split(b"\0", 1)[0].decode("utf-8", "replace")
        return _new(ProcEvent, ("comm", a, b, timestamp, cpu, 0, 0, comm, 0, what))
    return None


def decode_datagram(data: bytes) -> List[ProcEvent]:
    """All events in one datagram (the kernel sends one per datagram, but netlink allows more)."""
    events = []
    offset = 0
    while offset + _NLMSGHDR.size <= len(data):
        (length,) = struct.unpack_from("=I", data, offset)
        if length < _NLMSGHDR.size:
            break
        event = decode_event(data, offset)
        if event is not None:
            events.append(event)
        offset += (length + 3) & ~3
    return events


def kernel_release(release: Optional[str] = None) -> Tuple[int, int]:
    """(major, minor) of the running kernel (or of a release string such as "6.18.4-1-amd64")."""
    match = re.match(r"(\d+)\.(\d+)", release if release is not None else os.uname().release)
    return (int(match.group(1)), int(match.group(2))) if match else (0, 0)


def _control_message(op: int, cookie: int, events: Optional[int] = None) -> bytes:
    """A PROC_CN_MCAST_* request, with an event-type mask where `events` is given (Linux >= 6.6).
    The kernel's ack echoes cn_msg.ack + 1 (newer kernels overwrite cn_msg.seq with their own
    counter), so `cookie` goes in ack to recognise our ack among other listeners' ones."""
    payload = struct.pack("=I", op) if events is None else struct.pack("=II", op, events)
    cn = _CN_MSG.pack(CN_IDX_PROC, CN_VAL_PROC, cookie, cookie, len(payload), 0) + payload
    return _NLMSGHDR.pack(_NLMSGHDR.size + len(cn), NLMSG_DONE, 0, cookie, os.getpid()) + cn
