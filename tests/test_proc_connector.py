"""The netlink process events connector: decoding, and real events from real processes."""

from __future__ import annotations

import os
import select
import shutil
import struct
import subprocess
import sys
import time

import pytest

from temperd.sources import proc_connector as pc
from temperd.sources.proc_connector import (ConnectorUnavailable, ProcConnector, decode_datagram, decode_event)


def message(what: int, data: bytes, cpu: int = 1, timestamp: int = 123456789, idx: int = pc.CN_IDX_PROC,
            nl_type: int = pc.NLMSG_DONE, ack: int = 0) -> bytes:
    event = struct.pack("=IIQ", what, cpu, timestamp) + data
    event = event.ljust(40, b"\0")  # sizeof(struct proc_event)
    cn = struct.pack("=IIIIHH", idx, pc.CN_VAL_PROC, 7, ack, len(event), 0) + event
    return struct.pack("=IHHII", 16 + len(cn), nl_type, 0, 7, 0) + cn


def test_decode_each_event_kind():
    fork = decode_event(message(pc.PROC_EVENT_FORK, struct.pack("=iiii", 10, 10, 11, 10)))
    assert (fork.kind, fork.tid, fork.pid, fork.parent_tid, fork.parent_pid) == ("fork", 11, 10, 10, 10)
    assert (fork.cpu, fork.timestamp_ns) == (1, 123456789)

    exec_ = decode_event(message(pc.PROC_EVENT_EXEC, struct.pack("=ii", 20, 20)))
    assert (exec_.kind, exec_.tid, exec_.pid) == ("exec", 20, 20)

    comm = decode_event(message(pc.PROC_EVENT_COMM, struct.pack("=ii16s", 31, 30, b"fifteen-chars-x")))
    assert (comm.kind, comm.tid, comm.pid, comm.comm) == ("comm", 31, 30, "fifteen-chars-x")

    exit_ = decode_event(message(pc.PROC_EVENT_EXIT, struct.pack("=iiII", 41, 40, 256, 17)))
    assert (exit_.kind, exit_.tid, exit_.pid, exit_.exit_code) == ("exit", 41, 40, 256)

    ack = decode_event(message(pc.PROC_EVENT_NONE, struct.pack("=I", 1)))
    assert (ack.kind, ack.exit_code) == ("ack", 1)

    uid = decode_event(message(0x4, struct.pack("=iiII", 50, 50, 0, 0)))
    assert (uid.kind, uid.what, uid.pid) == ("other", 0x4, 50)


def test_decode_ignores_what_is_not_a_proc_event():
    assert decode_event(message(pc.PROC_EVENT_EXEC, struct.pack("=ii", 1, 1), idx=2)) is None
    assert decode_event(message(pc.PROC_EVENT_EXEC, struct.pack("=ii", 1, 1), nl_type=pc.NLMSG_ERROR)) is None
    assert decode_event(message(pc.PROC_EVENT_EXEC, struct.pack("=ii", 1, 1))[:30]) is None


def test_a_lone_event_is_decoded_in_one_unpack_as_decode_event_would():
    """The kernel's datagrams hold one event each (ONE_EVENT_SIZE): decode_single reads the four
    kinds temperd wants the same as decode_event, and leaves the rest to decode_datagram."""
    wanted = [message(pc.PROC_EVENT_FORK, struct.pack("=iiii", 10, 10, 11, 10)),
              message(pc.PROC_EVENT_EXEC, struct.pack("=ii", 20, 21)),
              message(pc.PROC_EVENT_COMM, struct.pack("=ii16s", 31, 30, b"fifteen-chars-x")),
              message(pc.PROC_EVENT_COMM, struct.pack("=ii16s", 31, 30, b"ab\0stale")),
              message(pc.PROC_EVENT_EXIT, struct.pack("=iiII", 41, 40, 256, 17))]
    for data in wanted:
        assert len(data) == pc.ONE_EVENT_SIZE
        assert pc.decode_single(data) == decode_event(data)
    assert pc.decode_single(wanted[2]).comm == "fifteen-chars-x" and pc.decode_single(wanted[3]).comm == "ab"
    assert pc.decode_single(message(pc.PROC_EVENT_NONE, struct.pack("=I", 1))) is None  # an ack
    assert pc.decode_single(message(0x4, struct.pack("=iiII", 50, 50, 0, 0))) is None  # another kind
    assert pc.decode_single(message(pc.PROC_EVENT_EXEC, struct.pack("=ii", 1, 1), idx=2)) is None
    assert pc.decode_single(message(pc.PROC_EVENT_EXEC, struct.pack("=ii", 1, 1), nl_type=pc.NLMSG_ERROR)) is None


def test_decode_datagram_with_several_messages():
    one = message(pc.PROC_EVENT_FORK, struct.pack("=iiii", 1, 1, 2, 2))
    two = message(pc.PROC_EVENT_EXIT, struct.pack("=iiII", 2, 2, 0, 17))
    events = decode_datagram(one + two)
    assert [(e.kind, e.pid) for e in events] == [("fork", 2), ("exit", 2)]


@pytest.fixture
def connector():
    conn = ProcConnector()
    try:
        conn.open()
    except ConnectorUnavailable as exc:
        pytest.skip(f"process events unavailable here: {exc}")
    yield conn
    conn.close()


def collect(conn: ProcConnector, until, timeout: float = 2.0):
    events = []
    deadline = time.monotonic() + timeout
    overflowed = False
    while time.monotonic() < deadline:
        select.select([conn], [], [], 0.05)
        batch = conn.drain()
        events.extend(batch.events)
        overflowed = overflowed or batch.overflowed
        if until(events):
            break
    return events, overflowed


def test_real_fork_exec_exit_of_a_child(connector):
    before = time.monotonic_ns()
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(timeout=10)
    events, _ = collect(connector, lambda evs: any(e.kind == "exit" and e.pid == child.pid for e in evs))
    mine = [e for e in events if e.pid == child.pid]
    kinds = [e.kind for e in mine]
    assert kinds[0] == "fork" and "exec" in kinds and kinds[-1] == "exit", kinds
    fork = mine[0]
    assert fork.tid == child.pid and fork.parent_pid == os.getpid()
    # Timestamps are CLOCK_MONOTONIC, comparable with time.monotonic_ns().
    assert before <= fork.timestamp_ns <= time.monotonic_ns()


RENAMING_CHILD = r"""
import ctypes, sys, threading
libc = ctypes.CDLL(None, use_errno=True)
done = threading.Event()
def worker():
    print(threading.get_native_id(), flush=True)
    sys.stdin.readline()
    libc.prctl(15, b"renamed-by-test", 0, 0, 0)
    done.set()
t = threading.Thread(target=worker)
t.start()
t.join()
"""


def test_real_comm_event_names_the_thread(connector):
    child = subprocess.Popen([sys.executable, "-c", RENAMING_CHILD], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        tid = int(child.stdout.readline())
        child.stdin.write("go\n")
        child.stdin.flush()
        events, _ = collect(connector, lambda evs: any(e.kind == "comm" and e.tid == tid for e in evs))
        comm = [e for e in events if e.kind == "comm" and e.tid == tid]
        assert comm and comm[0].pid == child.pid and comm[0].comm == "renamed-by-test"
    finally:
        child.kill()
        child.wait()


BURST_CHILD = r"""
import threading
for _ in range(300):
    t = threading.Thread(target=lambda: None)
    t.start()
    t.join()
"""


def test_overflow_is_reported_and_events_continue():
    connector = ProcConnector(rcvbuf_bytes=1)  # the kernel rounds up to its minimum: a handful of events
    try:
        connector.open()
    except ConnectorUnavailable as exc:
        pytest.skip(f"process events unavailable here: {exc}")
    try:
        subprocess.run([sys.executable, "-c", BURST_CHILD], check=True, timeout=30)
        events, overflowed = collect(connector, lambda evs: False, timeout=0.2)
        assert overflowed, f"no ENOBUFS after a burst of 600 events ({len(events)} received)"
        # Read while the child runs: the socket's buffer still holds only a handful of events.
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.1)"])
        events, _ = collect(connector, lambda evs: any(e.kind == "exit" and e.pid == child.pid for e in evs))
        child.wait(timeout=10)
        assert {"fork", "exit"} <= {e.kind for e in events if e.pid == child.pid}
    finally:
        connector.close()


def test_close_unsubscribes(connector):
    assert connector.fileno() >= 0
    connector.close()
    with pytest.raises(ValueError):
        connector.fileno()
    connector.close()  # twice is harmless


def test_unavailable_in_a_foreign_pid_namespace():
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("util-linux unshare is not installed")
    code = (
        "from temperd.sources.proc_connector import ProcConnector, ConnectorUnavailable\n"
        "try:\n"
        "    ProcConnector().open(ack_timeout_s=0.3)\n"
        "    print('opened')\n"
        "except ConnectorUnavailable as exc:\n"
        "    print('unavailable:', exc)\n"
    )
    probe = subprocess.run([unshare, "--user", "--map-root-user", "--pid", "--fork", sys.executable, "-c", code],
                           capture_output=True, text=True, timeout=30)
    if probe.returncode != 0 and "unshare" in probe.stderr:
        pytest.skip(f"cannot create user and pid namespaces here: {probe.stderr.strip()}")
    assert probe.stdout.startswith("unavailable: "), probe.stdout + probe.stderr
    assert "namespace" in probe.stdout
