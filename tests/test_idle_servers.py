"""The control socket's and the HTTP endpoint's accept threads sleep while no client comes: no
timer wakes them to look for a stop (on an idle host those wake-ups were half of temperd's CPU
budget), and stop() still ends them at once, and a client is still served."""

from __future__ import annotations

import socket
import time
import urllib.request

from temperd.daemon.control import ControlServer
from temperd.control.client import request
from temperd.observe.http import HttpApi
from thread_children import holds, steady


def _wakeups(thread) -> int:
    total = 0
    with open(f"/proc/self/task/{thread.native_id}/status") as handle:
        for line in handle:
            if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                total += int(line.split()[1])
    return total


def _assert_sleeps_then_stops(server, thread_of):
    thread = thread_of(server)
    before = steady(lambda: _wakeups(thread), "the accept thread's wakeups")  # past start-up and the first client
    # A timer to look for a stop would wake it several times a second.
    holds(lambda: _wakeups(thread) == before, 1.5, "the accept thread sleeps with no client")
    started = time.monotonic()
    server.stop()
    assert time.monotonic() - started < 2.0 and not thread.is_alive()


def test_the_control_socket_thread_sleeps_until_a_client_and_stops_at_once(tmp_path):
    path = str(tmp_path / "temperd.sock")
    server = ControlServer(path, {"ping": lambda req, progress: {"pong": True}}, group="root")
    server.start()
    assert request(path, "ping", timeout=5)["pong"] is True
    _assert_sleeps_then_stops(server, lambda s: s._thread)


def test_the_http_thread_sleeps_until_a_client_and_stops_at_once():
    server = HttpApi("127.0.0.1", 0, lambda: b"up 1\n", lambda: {})
    server.bind()
    server.serve()
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=5) as reply:
        assert b"up 1" in reply.read()
    _assert_sleeps_then_stops(server, lambda s: s._thread)
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", server.port)) != 0  # the listener is closed
