"""Fuzzing the control socket's request parser and temperctl's reply parser with hypothesis.

Whatever line a client sends (any bytes, any JSON value, a known command with any arguments),
temperd's only answer is a protocol reply: {"ok": true, ...} or {"ok": false, "error": one line};
no exception escapes, nothing is logged as an error, and the serving thread lives on. Whatever
bytes come back to temperctl, it gets a reply dict or DaemonUnavailable, nothing else."""

from __future__ import annotations

import json
import logging
import os
import socket
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from temperd.daemon import trace_commands
from temperd.daemon.control import ControlServer
from temperd.control.client import request
from temperd.control.protocol import MAX_REQUEST, DaemonUnavailable, parse_reply
from temperd.daemon.control_commands import ControlCommands
from temperd.trace.capture import TraceError
from test_control_socket import STATUS, FakeDaemon, stub_daemon

FUZZ = settings(max_examples=300, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

json_scalar = st.one_of(st.none(), st.booleans(), st.integers(min_value=-2**80, max_value=2**80),
                        st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=30),
                        st.sampled_from([1e400, -1e400, 2**63, -1, 0, 4194304, 4194305, "", "10s", "64M", "1e400"]))
# Named functions, not lambdas, in the strategies: hypothesis describes a lambda by finding and
# parsing its source, at every draw of a strategy built inside st.recursive.


def json_containers(inner):
    return st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4))


def with_command(cmd, args):
    return {**args, "cmd": cmd}


def json_line(value) -> bytes:
    return json.dumps(value).encode()


def reply_line(value) -> bytes:
    return json.dumps(value).encode() + b"\n"


json_value = st.recursive(json_scalar, json_containers, max_leaves=12)
commands = st.sampled_from(["status", "reload", "plan", "explain", "trace", "", "STATUS", "nope", "__class__"])
keys = st.sampled_from(["id", "duration", "max_size", "pid", "unit", "gzip", "requester", "cmd", "x"])
requests_ = st.one_of(
    st.builds(with_command, st.one_of(commands, json_value), st.dictionaries(keys, json_value, max_size=5)),
    json_value,
)
request_lines = st.one_of(
    st.binary(max_size=2000),
    requests_.map(json_line),
    st.text(max_size=200).map(str.encode),
    st.sampled_from([b"[" * 5000, b"{" * 5000, b'{"cmd": "status"', b"\xff\xfe{}", b"NaN", b'{"cmd": "explain", "id": 1e400}']),
)


@pytest.fixture(scope="module")
def handlers(tmp_path_factory):
    """The daemon's handlers on a stub daemon; trace's capture replaced, so nothing is captured."""
    patch = pytest.MonkeyPatch()
    patch.setattr(trace_commands, "TRACE_DIR", str(tmp_path_factory.mktemp("traces")))

    def no_capture(request, progress=None):
        raise TraceError("capture stubbed in this test")

    patch.setattr(trace_commands, "capture", no_capture)
    commands = ControlCommands(stub_daemon())
    table = commands.handlers()
    table["reload"] = lambda request, progress: {"reload": {"ok": True}}
    yield table
    patch.undo()


def assert_protocol_reply(reply):
    assert isinstance(reply, dict) and isinstance(reply.get("ok"), bool), reply
    if not reply["ok"]:
        assert isinstance(reply["error"], str) and reply["error"] and "\n" not in reply["error"], reply
        assert not reply["error"].startswith("internal error"), reply
    json.dumps(reply, default=str)


class ErrorLog(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.records = []

    def emit(self, record):
        self.records.append(record)


@pytest.fixture
def errors():
    handler = ErrorLog()
    logging.getLogger("temperd").addHandler(handler)
    yield handler.records
    logging.getLogger("temperd").removeHandler(handler)


@FUZZ
@given(line=request_lines)
def test_dispatch_answers_any_line_with_a_protocol_reply(handlers, errors, line):
    server = ControlServer("/nonexistent/unused.sock", handlers)
    assert_protocol_reply(server.dispatch(line))
    assert errors == [], [r.getMessage() for r in errors]


@pytest.fixture(scope="module")
def live(handlers, tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("the control socket serves root (and group temper)")
    server = ControlServer(str(tmp_path_factory.mktemp("sock") / "temperd.sock"), handlers)
    server.start()
    yield server
    server.stop()


@FUZZ
@given(line=request_lines)
def test_the_socket_answers_any_line_and_keeps_serving(live, errors, line):
    """Through a real connection: one reply line per request line, then the next request on
    the same connection is served too."""
    line = line.replace(b"\n", b" ")[:MAX_REQUEST - 1] + b"\n"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(10)
        sock.connect(live.path)
        sock.sendall(line + b'{"cmd": "status"}\n')
        stream = sock.makefile("rb")
        assert_protocol_reply(parse_reply(stream.readline()))
        assert parse_reply(stream.readline()) == {"ok": True, "status": STATUS.to_json()}
    assert errors == [], [r.getMessage() for r in errors]
    assert live._thread.is_alive()


@FUZZ
@given(data=st.one_of(st.binary(max_size=500), json_value.map(reply_line)))
def test_parse_reply_gives_a_reply_or_bad_reply(data):
    try:
        reply = parse_reply(data)
    except DaemonUnavailable as exc:
        assert str(exc) and "\n" not in str(exc)
        return
    assert isinstance(reply, dict)
    assert reply.get("progress") is True or isinstance(reply.get("ok"), bool)
    if reply.get("ok") is False:
        assert isinstance(reply["error"], str) and "\n" not in reply["error"]


@pytest.fixture
def sock_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("fake")


@FUZZ
@given(answer=st.one_of(st.binary(max_size=300), json_value.map(reply_line)))
def test_request_raises_only_daemon_unavailable(sock_dir, answer):
    path = str(sock_dir / f"fake-{threading.get_ident()}.sock")
    if os.path.exists(path):
        os.unlink(path)
    fake = FakeDaemon(path, answer)
    try:
        try:
            reply = request(path, "status", timeout=5)
        except DaemonUnavailable as exc:
            assert str(exc) and "\n" not in str(exc)
            return
        assert isinstance(reply, dict) and isinstance(reply["ok"], bool)
    finally:
        fake.close()
