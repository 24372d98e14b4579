"""The control socket: its owner (root and group temper, set without chown where it is born so), its
bounds (request size, idle clients, clients at once), bad requests, and temperctl facing a daemon
that is not there, hung, overloaded or answering nonsense: one line each, never a traceback."""

from __future__ import annotations

import contextlib
import grp
import json
import os
import socket
import stat
import threading
import time
import types

import pytest
from click.testing import CliRunner

from temperctl import daemon_cmd
from temperctl.main import main as temperctl
from temperd.control import client as control_client
from temperd.daemon import control as control_server
from temperd.daemon.control import ControlServer
from temperd.control.client import request
from temperd.control.protocol import BadReply, DaemonNotRunning, DaemonUnavailable, parse_reply
from temperd.daemon.control_commands import ControlCommands
from temperd.decide.matcher import MatchResult
from temperd.sources.inventory import Inventory
import status_sample
from thread_children import wait_for


def _serve(tmp_path, monkeypatch, group: str):
    calls = []

    def chown(path, uid, gid):
        calls.append((uid, gid))
        return real_chown(path, uid, gid)

    real_chown = os.chown
    monkeypatch.setattr(os, "chown", chown)
    server = ControlServer(str(tmp_path / "temperd.sock"), {}, group=group)
    server.start()
    info = os.stat(server.path)
    server.stop()
    return calls, info


def test_socket_born_with_the_group_is_not_chowned(tmp_path, monkeypatch):
    """As under the unit (Group=temper): the unit's system call filter would refuse chown."""
    if os.geteuid() != 0:
        pytest.skip("the socket is root's: run as root")
    own = grp.getgrgid(os.getegid()).gr_name
    calls, info = _serve(tmp_path, monkeypatch, own)
    assert calls == []
    assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (0, os.getegid(), 0o660)


def test_socket_is_given_to_the_group_where_it_differs(tmp_path, monkeypatch):
    if os.geteuid() != 0:
        pytest.skip("chown to another group needs root")
    other = next((g for g in grp.getgrall() if g.gr_gid != os.getegid()), None)
    if other is None:
        pytest.skip("no second group on this host")
    calls, info = _serve(tmp_path, monkeypatch, other.gr_name)
    assert calls == [(0, other.gr_gid)]
    assert (info.st_uid, info.st_gid) == (0, other.gr_gid)


# ---- bounds, bad requests, and temperctl facing a daemon that misbehaves ------------------------



needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the control socket serves root (and group temper)")


STATUS = status_sample.status()


def stub_daemon():
    """What ControlCommands reads of a Daemon: an empty inventory, no plan."""
    return types.SimpleNamespace(lock=threading.RLock(), inventory=Inventory(), match=MatchResult(), plan=None,
                                 matcher=None, status=lambda: STATUS,
                                 view=types.SimpleNamespace(shape=types.SimpleNamespace(describe=lambda: "2 CPUs")))


@pytest.fixture
def served(tmp_path):
    server = ControlServer(str(tmp_path / "temperd.sock"), ControlCommands(stub_daemon()).handlers(), max_clients=2)
    server.start()
    yield server
    server.stop()


def runner():
    try:
        return CliRunner(mix_stderr=False)
    except TypeError:  # click >= 8.2 keeps them apart anyway
        return CliRunner()


def one_line_failure(result, code=1):
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr, result.exception)
    assert "Traceback" not in result.stderr and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("temperctl: ")
    return result.stderr


def test_explain_refuses_bad_ids_in_one_line(caplog):
    server = ControlServer("/nonexistent/unused.sock", ControlCommands(stub_daemon()).handlers())
    for raw in (b'{"cmd": "explain", "id": 1e400}', b'{"cmd": "explain", "id": "12"}', b'{"cmd": "explain", "id": -1}',
                b'{"cmd": "explain", "id": 0}', b'{"cmd": "explain", "id": 100000000000000000000000000000}',
                b'{"cmd": "explain", "id": true}', b'{"cmd": "explain", "id": 1.5}', b'{"cmd": "explain"}',
                b'{"cmd": "explain", "id": [1]}'):
        reply = server.dispatch(raw)
        assert reply["ok"] is False and reply["error"].startswith("id: expected a PID or TID, a whole number from 1 "), raw
        assert "\n" not in reply["error"]
    assert server.dispatch(b'{"cmd": "explain", "id": 4194304}') == {"ok": False, "error": "no process or thread 4194304"}
    assert [r for r in caplog.records if r.levelname == "ERROR"] == []


@needs_root
def test_a_huge_request_line_is_refused_at_the_limit_not_buffered(served):
    """100 MB without a newline: refused once MAX_REQUEST bytes are in, long before the rest is sent."""
    sock = socket.socket(socket.AF_UNIX)
    sock.connect(served.path)
    sent = [0]

    def flood():
        chunk = b"x" * (1 << 20)
        try:
            while sent[0] < 100 << 20:
                sock.sendall(chunk)
                sent[0] += len(chunk)
        except OSError:
            pass

    sender = threading.Thread(target=flood, daemon=True)
    sender.start()
    sock.settimeout(10)
    reply = parse_reply(sock.makefile("rb").readline())
    assert reply == {"ok": False, "error": "request too large: more than 65536 bytes without a newline; "
                                           "expected one JSON object per line"}
    sender.join(10)
    assert sent[0] < 50 << 20, sent[0]  # the server closed: the rest could not be sent
    sock.close()


@needs_root
def test_an_idle_client_is_told_and_closed(tmp_path, monkeypatch):
    monkeypatch.setattr(control_server, "REQUEST_TIMEOUT_S", 0.5)
    server = ControlServer(str(tmp_path / "temperd.sock"), {})
    server.start()
    try:
        sock = socket.socket(socket.AF_UNIX)
        sock.settimeout(5)
        sock.connect(server.path)
        sock.sendall(b'{"cmd": "sta')  # a request begun and never finished
        started = time.monotonic()
        stream = sock.makefile("rb")
        assert parse_reply(stream.readline())["error"] == "no whole request line within 0.5 s; closing"
        assert stream.readline() == b"" and time.monotonic() - started < 3
        sock.close()
    finally:
        server.stop()


@needs_root
def test_clients_beyond_the_cap_are_told_so(served):
    idle = []
    for _ in range(2):
        sock = socket.socket(socket.AF_UNIX)
        sock.connect(served.path)
        idle.append(sock)
    wait_for(lambda: served._server._active == 2, 5, "the server counting both idle clients")
    reply = request(served.path, "status", timeout=5)
    assert reply["ok"] is False and reply["error"].startswith("temperd is busy: 2 clients are connected")
    for sock in idle:
        sock.close()
    # Each handler sees its client's EOF in its own thread; on a loaded host that can take a while.
    wait_for(lambda: served._server._active == 0, 30, "the server releasing both closed clients")
    assert request(served.path, "status", timeout=5) == {"ok": True, "status": STATUS.to_json()}


@needs_root
def test_clients_that_go_away_before_the_reply_are_no_error(served, caplog):
    with caplog.at_level("DEBUG", logger="temperd.control"):
        for _ in range(20):
            sock = socket.socket(socket.AF_UNIX)
            sock.connect(served.path)
            # A client turned away as busy (two are served at a time) finds the socket closed.
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                sock.sendall(b'{"cmd": "status"}\n' * 50)
            sock.close()
        # Up to two of them may still be served when this client comes, and it is then told the
        # daemon is busy (seen in CI); it asks again until it is answered. Once none is active,
        # every one of the twenty was served to its end (and had its chance to log).
        replies = []

        def answered() -> bool:
            replies.append(request(served.path, "status", timeout=5))
            return replies[-1]["ok"] or not replies[-1]["error"].startswith("temperd is busy")

        wait_for(answered, 10, "a status request answered once the twenty are served")
        assert replies[-1]["ok"], replies[-1]
        wait_for(lambda: served._server._active == 0, 10, "every client served to its end")
    assert [r for r in caplog.records if r.levelname in ("ERROR", "WARNING") or r.exc_info] == []


# temperctl against a daemon that is not there, hung, overloaded or talking nonsense


def test_status_exits_3_where_temperd_is_not_running(tmp_path):
    stale = tmp_path / "stale.sock"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(stale))  # bound, never listening: what a killed temperd leaves
    (tmp_path / "file").write_text("")
    for path in (tmp_path / "absent.sock", stale, tmp_path / "file" / "temperd.sock"):
        err = one_line_failure(runner().invoke(temperctl, ["status", "--socket", str(path)]), code=3)
        assert "temperd is not running" in err, err
    # Everything else that fails is 1, and so is reload where no temperd runs.
    err = one_line_failure(runner().invoke(temperctl, ["reload", "--socket", str(tmp_path / "absent.sock")]))
    assert "temperd is not running" in err
    with pytest.raises(DaemonNotRunning):
        request(str(tmp_path / "file" / "temperd.sock"), "status")


class FakeDaemon:
    """A Unix socket that answers every request with the same bytes (or never answers)."""

    def __init__(self, path: str, answer=None, close_after: bool = True):
        self.path, self.answer, self.close_after = path, answer, close_after
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.bind(path)
        self.sock.listen(16)
        self.kept = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            conn.settimeout(5)
            try:
                conn.recv(65536)
                if self.answer is None:
                    self.kept.append(conn)  # hung: holds the connection, says nothing
                    continue
                conn.sendall(self.answer)
            except OSError:
                pass
            if self.close_after:
                conn.close()
            else:
                self.kept.append(conn)

    def close(self):
        self.sock.close()
        for conn in self.kept:
            conn.close()


@pytest.mark.parametrize("answer, says", [
    (b"garbage\n", "temperd's reply is not JSON"),
    (b'{"ok": tr', "temperd's reply was cut off"),
    (b"", "temperd closed the connection without a reply"),
    (b"[1, 2]\n", "temperd's reply is not a JSON object"),
    (b'{"status": {}}\n', "temperd's reply says neither ok nor failed"),
    (b'{"ok": true}\n', "temperd's status reply is not one this temperctl reads"),
    (b'{"ok": true, "status": {"version": 1}}\n', "temperd's status reply is not one this temperctl reads"),
    (b'{"ok": false, "error": "no\\nway"}\n', "temperctl: no way"),
    (b'{"ok": false, "error": 42}\n', "temperctl: request failed"),
    (b"[" * 100000 + b"\n", "temperd's reply is not JSON"),
])
def test_a_garbage_or_incomplete_reply_is_one_line(tmp_path, answer, says):
    fake = FakeDaemon(str(tmp_path / "fake.sock"), answer)
    try:
        err = one_line_failure(runner().invoke(temperctl, ["status", "--socket", fake.path]))
        assert says in err, err
    finally:
        fake.close()


def test_a_hung_daemon_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(daemon_cmd, "TIMEOUT_S", 0.5)
    fake = FakeDaemon(str(tmp_path / "hung.sock"), None)
    try:
        err = one_line_failure(runner().invoke(temperctl, ["status", "--socket", fake.path]))
        assert "temperd did not answer within 0.5 s: it may be hung" in err
        with pytest.raises(DaemonUnavailable) as info:
            request(fake.path, "explain", timeout=0.3, id=1)
        assert "did not answer within 0.3 s" in str(info.value)
    finally:
        fake.close()


def test_a_full_connection_queue_is_one_line(tmp_path, monkeypatch):
    """A temperd that no longer accepts: its backlog fills and connect() says EAGAIN."""
    monkeypatch.setattr(control_client, "CONNECT_TIMEOUT_S", 0.3)
    path = str(tmp_path / "full.sock")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    listener.listen(0)
    queued = []
    try:
        for _ in range(8):
            sock = socket.socket(socket.AF_UNIX)
            sock.setblocking(False)
            try:
                sock.connect(path)
            except BlockingIOError:
                sock.close()
                break
            queued.append(sock)
        err = one_line_failure(runner().invoke(temperctl, ["status", "--socket", path]))
        assert "temperd does not accept connections on" in err and "it may be hung or overloaded" in err
    finally:
        for sock in queued:
            sock.close()
        listener.close()


def test_parse_reply_takes_only_protocol_replies():
    assert parse_reply(b'{"ok": true, "x": 1}\n') == {"ok": True, "x": 1}
    assert parse_reply(b'{"progress": true, "events": 3}\n') == {"progress": True, "events": 3}
    assert parse_reply(b'{"ok": false}\n') == {"ok": False, "error": "request failed"}
    for bad in (b"", b"\n", b"nul\n", b'"ok"\n', b'{"ok": 1}\n', b'{"ok": true}', b"\xff\xfe\n"):
        with pytest.raises(BadReply):
            parse_reply(bad)
    assert json.loads(json.dumps(parse_reply(b'{"ok": false, "error": "a\\u0000b"}\n')))


def test_a_reply_sent_before_the_daemon_closed_is_read_even_when_the_request_was_not_taken(tmp_path, monkeypatch):
    """temperd tells a client it is busy and closes at once: the request then meets a closed
    socket (EPIPE), and the reply already sent is what temperctl shows."""
    path = str(tmp_path / "busy.sock")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    listener.listen(1)

    def busy():
        conn, _ = listener.accept()
        conn.sendall(b'{"ok": false, "error": "temperd is busy: 16 clients are connected"}\n')
        conn.close()

    server = threading.Thread(target=busy, daemon=True)
    server.start()
    connect = control_client._connect

    def slow_connect(*args):
        sock = connect(*args)
        server.join(5)  # the daemon has answered and closed before the request is sent
        return sock

    monkeypatch.setattr(control_client, "_connect", slow_connect)
    try:
        assert request(path, "status", timeout=5) == {"ok": False, "error": "temperd is busy: 16 clients are connected"}
    finally:
        listener.close()
