"""`temperctl trace` through a real control socket served by temperd's ControlServer with the
trace handler, and directly when no temperd listens."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from temperctl.main import main
from temperd.daemon import trace_commands as trace_service
from temperd.daemon.control import ControlServer
from temperd.trace.capture import CaptureLock
from temperd.trace.parse import parse_trace
from test_cli_plan import split_runner
from test_daemon_e2e import BINDIR, Temperd
import test_trace_capture
from test_trace_capture import KILLED, ROOT, assert_perfetto_format, instances, needs_tracefs

pingpong = test_trace_capture.pingpong  # the fixture: two threads that wake each other


@pytest.fixture
def control(tmp_path, monkeypatch):
    """temperd's control socket with the trace command, writing its traces under tmp_path."""
    monkeypatch.setattr(trace_service, "TRACE_DIR", str(tmp_path / "daemon-traces"))
    server = ControlServer(str(tmp_path / "temperd.sock"), {"trace": trace_service.trace_handler})
    server.start()
    yield server
    server.stop()


def temperctl(*args):
    return split_runner().invoke(main, ["trace", *args], catch_exceptions=False)


@needs_tracefs
def test_trace_through_the_daemon_with_progress(control, pingpong, tmp_path):
    out = tmp_path / "via-daemon.trace"
    result = temperctl("--duration", "1.2s", "--pid", str(pingpong.pid), "-o", str(out), "--socket", control.path)
    assert result.exit_code == 0, result.stderr
    assert "via temperd" in result.stdout and "events in 1." in result.stdout
    assert "sched_switch" in result.stdout and "ui.perfetto.dev" in result.stdout
    assert "capturing: " in result.stderr and "not running" not in result.stderr  # progress while it ran
    assert_perfetto_format(str(out))
    summary = parse_trace(str(out))
    assert summary.edges.get((pingpong.ping, pingpong.pong), 0) > 50
    reported = int(result.stdout.split(" events in ")[0].rsplit(" ", 1)[1])
    assert reported == summary.events
    assert os.listdir(trace_service.TRACE_DIR) == []  # temperctl (root) removed temperd's copy


@needs_tracefs
def test_refused_while_another_capture_runs(control, tmp_path):
    holder = {"pid": 4242, "started_at": 0, "requester": "someone-else", "output": "/srv/their.trace", "duration_s": 30}
    with CaptureLock(holder):
        via_daemon = temperctl("--duration", "1s", "-o", str(tmp_path / "a.trace"), "--socket", control.path)
        direct = temperctl("--duration", "1s", "-o", str(tmp_path / "b.trace"), "--direct")
    for result in (via_daemon, direct):
        assert result.exit_code == 1
        assert "already running" in result.stderr and "pid 4242" in result.stderr
        assert "someone-else" in result.stderr and "/srv/their.trace" in result.stderr
        assert "Traceback" not in result.stderr
    assert not os.path.exists(tmp_path / "a.trace") and not os.path.exists(tmp_path / "b.trace")


@needs_tracefs
def test_direct_when_the_daemon_is_not_running(pingpong, tmp_path):
    out = tmp_path / "direct.trace.gz"
    result = temperctl("--duration", "1s", "--pid", str(pingpong.pid), "-o", str(out),
                       "--socket", str(tmp_path / "nobody.sock"))
    assert result.exit_code == 0, result.stderr
    assert "temperd is not running: capturing directly" in result.stderr
    assert "(gzip)" in result.stdout and "via direct" in result.stdout
    with open(out, "rb") as handle:
        assert handle.read(2) == b"\x1f\x8b"
    assert parse_trace(str(out)).threads[pingpong.pong].switches_in > 50


def test_bad_input_is_one_line(tmp_path, control):
    too_long = temperctl("--duration", "2h", "-o", str(tmp_path / "x"))
    assert too_long.exit_code == 2 and "duration: expected" in too_long.stderr
    both = temperctl("--pid", "1", "--unit", "x", "-o", str(tmp_path / "x"))
    assert both.exit_code == 2 and "either --unit or --pid" in both.stderr
    nodir = temperctl("-o", str(tmp_path / "missing" / "x"), "--socket", control.path)
    assert nodir.exit_code == 1 and "does not exist" in nodir.stderr
    if os.geteuid() == 0:
        nopid = temperctl("--pid", "999999999", "--duration", "1s", "-o", str(tmp_path / "x"), "--socket", control.path)
        assert nopid.exit_code == 1 and "pid: expected a PID or TID" in nopid.stderr and "999999999" in nopid.stderr
        assert nopid.stderr.count("\n") == 1
    for result in (too_long, both, nodir):
        assert "Traceback" not in result.stderr


@needs_tracefs
def test_temperd_start_removes_a_killed_captures_instance_and_serves_trace(pingpong, tmp_path):
    doomed = subprocess.Popen([sys.executable, "-c", KILLED, ROOT, str(tmp_path / "doomed.trace")])
    leftover = f"temperd-{doomed.pid}-1"
    deadline = time.monotonic() + 10
    while leftover not in instances() and time.monotonic() < deadline:
        time.sleep(0.02)
    doomed.send_signal(signal.SIGKILL)
    doomed.wait()
    assert leftover in instances()
    daemon = Temperd(tmp_path)
    daemon.start()
    try:
        assert leftover not in instances()  # removed at start, before the socket was served
        out = tmp_path / "from-temperd.trace"
        done = subprocess.run([os.path.join(BINDIR, "temperctl"), "trace", "--duration", "1s", "--pid",
                               str(pingpong.pid), "-o", str(out), "--socket", daemon.socket],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr + daemon.logtext()
        assert "via temperd" in done.stdout and "capturing: " in done.stderr
        assert parse_trace(str(out)).edges.get((pingpong.ping, pingpong.pong), 0) > 50
    finally:
        assert daemon.stop() == 0, daemon.logtext()
