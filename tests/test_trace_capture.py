"""Real captures on this host: a private tracefs instance, a workload's threads and wakeups in the
parsed result, one capture at a time, leftovers of a killed capture, the host's own tracing
settings untouched, and the file format Perfetto imports."""

from __future__ import annotations

import fcntl
import gzip
import json
import os
import re
import select
import signal
import subprocess
import sys
import textwrap
import threading
import time
from typing import Any, Dict, Optional

import pytest

from temperd.trace import capture as tc
from temperd.trace.parse import parse_trace

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A line as temperd.trace.format writes it: what these tests hold the output to.
WRITTEN_LINE = re.compile(
    r"^ *(?P<comm>.+)-(?P<tid>\d+) +\( *(?P<tgid>\d+|-+)\) \[(?P<cpu>\d{3,})\] (?P<flags>[a-zA-Z0-9.]{4}) +"
    r"(?P<ts>\d+\.\d{6}): (?P<event>[^\s:]+): (?P<fields>.*)$")

# Perfetto's own head search (systrace_line_tokenizer): every written line must satisfy it.
PERFETTO_HEAD = re.compile(
    r"-(\d+)\s+\(?\s*(\d+|-+)?\)?\s?\[(\d+)\]\s*[a-zA-Z0-9.]{0,4}\s+(\d+\.\d+):\s+(\S+):")


def read_lock_holder(path: Optional[str] = None) -> Optional[Dict[str, Any]]:
    """The running capture, or None when no capture holds the lock."""
    path = path or tc.LOCK_PATH
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                return json.loads(os.pread(fd, 64 * 1024, 0).decode("utf-8", "replace"))
            except ValueError:
                return {}
        return None
    finally:
        os.close(fd)


def _tracefs():
    if os.geteuid() != 0:
        return None
    try:
        return tc.find_tracefs()
    except tc.TraceError:
        return None


TRACEFS = _tracefs()
needs_tracefs = pytest.mark.skipif(TRACEFS is None, reason="needs root and tracefs")

# Two threads of one process, named at the OS level, that wake each other through two pipes
# (ping writes, pong wakes, answers, ping wakes) about 500 times a second; gone after 30 s.
PINGPONG = r"""
import ctypes, json, os, select, sys, threading, time
libc = ctypes.CDLL(None)
a_r, a_w = os.pipe()
b_r, b_w = os.pipe()
tids = {}
ready = threading.Barrier(3)
def named(name):
    libc.prctl(15, name.encode(), 0, 0, 0)
    tids[name] = threading.get_native_id()
    ready.wait()
def ping():
    named("tmpd-ping")
    while True:
        os.write(a_w, b"x")
        os.read(b_r, 1)
        time.sleep(0.002)
def pong():
    named("tmpd-pong")
    while True:
        os.read(a_r, 1)
        os.write(b_w, b"y")
for target in (ping, pong):
    threading.Thread(target=target, daemon=True).start()
ready.wait()
print(json.dumps({"pid": os.getpid(), "threads": tids}), flush=True)
select.select([sys.stdin], [], [], 30)
"""


class PingPong:
    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", PINGPONG], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True)
        ready, _, _ = select.select([self.proc.stdout], [], [], 10)
        assert ready, "the ping-pong workload did not start"
        info = json.loads(self.proc.stdout.readline())
        self.pid = info["pid"]
        self.ping = info["threads"]["tmpd-ping"]
        self.pong = info["threads"]["tmpd-pong"]

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.proc.stdin.close()
        self.proc.stdout.close()


@pytest.fixture
def pingpong():
    workload = PingPong()
    yield workload
    workload.close()


def instances():
    return set(os.listdir(os.path.join(TRACEFS, "instances")))


GLOBAL_FILES = ("tracing_on", "current_tracer", "set_event", "set_event_pid", "buffer_size_kb", "trace_clock",
                "options/record-tgid", "options/event-fork")


def global_settings():
    out = {}
    for name in GLOBAL_FILES:
        with open(os.path.join(TRACEFS, name)) as handle:
            out[name] = handle.read()
    return out


def read_like_perfetto(path):
    """The file as Perfetto's systrace importer reads it (src/trace_processor/importers/systrace/):
    `<` first means the HTML container; a trace-data section whose PROCESS DUMP rows (long form,
    at least 10 tokens: user pid ppid vsz rss wchan pc s name cmdline...) name processes; a later
    trace-data section whose `# ... TASK-PID` legend line starts the ftrace lines, which end at
    `</script>` (nothing after it is read). Returns (process names by pid, ftrace lines)."""
    with open(path, "rb") as probe:
        opener = gzip.open if probe.read(2) == b"\x1f\x8b" else open
    with opener(path, "rt") as handle:
        lines = handle.read().splitlines()
    assert lines[0] == "<!DOCTYPE html>"
    names, events, state = {}, [], "html"
    for line in lines[1:]:
        if state == "html":
            state = "section" if '<script class="trace-data" type="application/text">' in line else state
        elif state == "section":
            if line.startswith("#") and "TASK-PID" in line:
                state = "ftrace"
            elif line.startswith("PROCESS DUMP"):
                state = "dump"
            elif "</script>" in line:
                state = "html"
        elif state == "dump":
            tokens = line.split()
            if "</script>" in line:
                state = "html"
            elif tokens[:4] != ["USER", "PID", "PPID", "VSZ"]:
                assert len(tokens) >= 10 and tokens[1].isdigit() and tokens[2].isdigit(), line
                names[int(tokens[1])] = tokens[8]
        elif state == "ftrace":
            if "</script>" in line:
                state = "end"
            elif line and not line.startswith("#"):
                events.append(line)
    assert state == "end", "the ftrace section is not closed"
    return names, events


def assert_perfetto_format(path):
    """Every ftrace line is an event whose head Perfetto's tokenizer finds, in the kernel's layout;
    the process dump names the thread groups the lines carry."""
    names, events = read_like_perfetto(path)
    assert events, "no events"
    for line in events:
        assert WRITTEN_LINE.match(line), line
        assert PERFETTO_HEAD.search(line), line
    tgids = {int(WRITTEN_LINE.match(line).group("tgid")) for line in events
             if WRITTEN_LINE.match(line).group("tgid").isdigit()} - {0}
    assert tgids and tgids <= set(names), f"thread groups without a process name: {sorted(tgids - set(names))}"
    return names, events


@needs_tracefs
def test_capture_finds_the_workload_threads_switches_and_wakeup_edges(pingpong, tmp_path):
    before_settings, before_instances = global_settings(), instances()
    notes = []
    result = tc.capture(tc.CaptureRequest(output=str(tmp_path / "host.trace"), duration_s=1.5, requester="test"),
                        progress=notes.append)
    assert result.stopped_by == "duration" and 1.4 <= result.duration_s < 3
    assert result.output == str(tmp_path / "host.trace") and not result.compressed
    assert result.events == sum(result.by_event.values()) > 1000
    assert {"sched_switch", "sched_waking", "sched_wakeup"} <= set(result.by_event)
    assert notes and notes[-1]["events"] > 0 and notes[-1]["duration_s"] == 1.5
    # a private instance, gone afterwards; the host's own buffer settings as they were
    assert result.instance.startswith(f"temperd-{os.getpid()}-")
    assert instances() == before_instances
    assert global_settings() == before_settings
    assert sorted(os.listdir(tmp_path)) == ["host.trace"]  # no raw or partial file left
    names, _ = assert_perfetto_format(result.output)
    with open(f"/proc/{pingpong.pid}/comm") as handle:
        assert names[pingpong.pid] == handle.read().strip()  # the process, by its own name

    summary = parse_trace(result.output)
    assert summary.events == result.events
    ping, pong = summary.threads[pingpong.ping], summary.threads[pingpong.pong]
    assert (ping.comm, pong.comm) == ("tmpd-ping", "tmpd-pong")
    assert ping.tgid == pong.tgid == pingpong.pid
    # ~500 round trips a second: each thread blocks and is switched in hundreds of times
    for thread in (ping, pong):
        assert thread.switches_in > 100 and thread.blocked > 100, thread
        assert 0 < thread.runtime_ns < 1.5e9
        assert thread.wakeups > 100
    assert summary.edges.get((pingpong.ping, pingpong.pong), 0) > 100
    assert summary.edges.get((pingpong.pong, pingpong.ping), 0) > 100


@needs_tracefs
def test_pid_filter_keeps_only_the_workload(pingpong, tmp_path):
    result = tc.capture(tc.CaptureRequest(output=str(tmp_path / "pid.trace"), duration_s=1.0, pid=pingpong.pid))
    assert {pingpong.pid, pingpong.ping, pingpong.pong} <= set(result.filter_pids)
    summary = parse_trace(result.output)
    ours = set(result.filter_pids)
    # the kernel filter: a switch is kept when one side is ours, other events when the task is
    others = [t for t in summary.threads.values() if t.tid not in ours and (t.switches_in and t.blocked + t.preempted)]
    assert summary.threads[pingpong.ping].switches_in > 50
    assert summary.edges.get((pingpong.ping, pingpong.pong), 0) > 50
    assert sum(t.switches_in for t in others) < summary.threads[pingpong.ping].switches_in
    with pytest.raises(tc.TraceError, match="no process with pid 999999999"):
        tc.capture(tc.CaptureRequest(output=str(tmp_path / "x.trace"), duration_s=1.0, pid=999999999))


@needs_tracefs
def test_unit_filter_takes_the_threads_of_the_units_processes(pingpong, tmp_path):
    # Where systemd keeps its units: the name=systemd hierarchy on legacy and hybrid hosts.
    root = next(r for r in ("/sys/fs/cgroup/systemd", "/sys/fs/cgroup/unified", "/sys/fs/cgroup") if os.path.isdir(r))
    unit_dir = os.path.join(root, "tmpd-trace-test.service")
    try:
        os.mkdir(unit_dir)
    except OSError as exc:
        pytest.skip(f"cannot make a cgroup for a test unit: {exc}")
    try:
        with open(os.path.join(unit_dir, "cgroup.procs"), "w") as procs:
            procs.write(str(pingpong.pid))
        assert tc.unit_pids("tmpd-trace-test") == [pingpong.pid]
        result = tc.capture(tc.CaptureRequest(output=str(tmp_path / "unit.trace"), duration_s=1.0,
                                              unit="tmpd-trace-test"))
        assert {pingpong.ping, pingpong.pong} <= set(result.filter_pids)
        # a busy host slows the ping-pong: any steady stream of wakeups shows the filter worked
        assert parse_trace(result.output).edges.get((pingpong.pong, pingpong.ping), 0) > 20
    finally:
        with open(os.path.join(root, "cgroup.procs"), "w") as procs:
            procs.write(str(pingpong.pid))
        os.rmdir(unit_dir)
    with pytest.raises(tc.TraceError, match="unit tmpd-trace-test.service has no running processes"):
        tc.filter_tids(None, "tmpd-trace-test.service")


@needs_tracefs
def test_second_capture_is_refused_naming_the_running_one(tmp_path):
    first_out = str(tmp_path / "first.trace")
    outcome = {}

    def first():
        outcome["result"] = tc.capture(tc.CaptureRequest(output=first_out, duration_s=1.5, requester="first-requester"))

    runner = threading.Thread(target=first)
    runner.start()
    try:
        # {} means locked with the holder not written yet (the moment after flock): wait for it
        deadline = time.monotonic() + 5
        while not read_lock_holder() and time.monotonic() < deadline:
            time.sleep(0.01)
        holder = read_lock_holder()
        assert holder and holder["pid"] == os.getpid() and holder["output"] == first_out
        started = time.monotonic()
        with pytest.raises(tc.CaptureBusy) as refused:
            tc.capture(tc.CaptureRequest(output=str(tmp_path / "second.trace"), duration_s=1.0, requester="second"))
        assert time.monotonic() - started < 0.5  # refused, not queued
        message = str(refused.value)
        assert "already running" in message and "first-requester" in message and first_out in message
        assert f"pid {os.getpid()}" in message
    finally:
        runner.join(10)  # a failure here must not leave the capture running into the next test
    assert outcome["result"].events > 0
    assert read_lock_holder() is None
    assert not os.path.exists(tmp_path / "second.trace")


def test_a_reader_looking_at_the_lock_does_not_refuse_a_starting_capture(tmp_path):
    """A reader (read_lock_holder) takes a shared lock for an instant: a capture starting in that instant
    found the lock held with no holder written and was refused as 'just starting'."""
    path = str(tmp_path / "trace.lock")
    with open(path, "w") as probe:
        fcntl.flock(probe, fcntl.LOCK_SH)  # a reader's probe, held longer than any real one
        releaser = threading.Timer(0.1, fcntl.flock, (probe, fcntl.LOCK_UN))
        releaser.start()
        try:
            with tc.CaptureLock({"pid": os.getpid(), "requester": "starting"}, path):
                assert read_lock_holder(path)["requester"] == "starting"
        finally:
            releaser.join()
    with open(path, "w") as stuck:  # held with no holder for longer than a starting capture takes
        fcntl.flock(stuck, fcntl.LOCK_EX)
        started = time.monotonic()
        with pytest.raises(tc.CaptureBusy, match="it is just starting"):
            with tc.CaptureLock({"pid": os.getpid()}, path):
                pass
        assert time.monotonic() - started < 2.0


KILLED = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[1])
    from temperd.trace import capture as tc
    tc.capture(tc.CaptureRequest(output=sys.argv[2], duration_s=30, requester="doomed"))
""")


@needs_tracefs
def test_killed_capture_leaves_an_instance_that_cleanup_removes(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", KILLED, ROOT, str(tmp_path / "doomed.trace")])
    name = f"temperd-{proc.pid}-1"
    try:
        deadline = time.monotonic() + 10
        while name not in instances() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert name in instances()
        assert read_lock_holder()["requester"] == "doomed"
        time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert name in instances()  # nothing ran its finally
    assert read_lock_holder() is None  # the kernel dropped the flock with the process
    mine = tc.Instance(TRACEFS)  # a live capture's instance (ours) and another tool's stay
    other = os.path.join(TRACEFS, "instances", "someone-else")
    os.mkdir(other)
    try:
        assert tc.cleanup_stale_instances() == [name]
        assert name not in instances()
        assert {mine.name, "someone-else"} <= instances()
        assert tc.cleanup_stale_instances() == []
    finally:
        mine.remove()
        os.rmdir(other)


@needs_tracefs
def test_interrupted_capture_removes_its_instance_and_writes_nothing(tmp_path):
    before = instances()

    def stop_it(note):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        tc.capture(tc.CaptureRequest(output=str(tmp_path / "cut.trace"), duration_s=5.0), progress=stop_it)
    assert instances() == before
    assert os.listdir(tmp_path) == []
    assert read_lock_holder() is None


@needs_tracefs
def test_size_cap_stops_early_and_gz_output_is_compressed(pingpong, tmp_path):
    result = tc.capture(tc.CaptureRequest(output=str(tmp_path / "small.trace.gz"), duration_s=5.0,
                                          max_bytes=64 * 1024))
    assert result.stopped_by == "size" and result.duration_s < 4.5
    assert result.compressed and result.output.endswith(".gz")
    assert 0 < result.text_bytes <= 64 * 1024 + 2048  # the cap, plus the header
    assert result.file_bytes < result.text_bytes
    _, events = assert_perfetto_format(result.output)
    assert len(events) == result.events


def test_limits_are_checked():
    assert tc.parse_duration("10s") == 10 and tc.parse_duration("500ms") == 0.5 and tc.parse_duration("1m") == 60
    assert tc.parse_size("64M") == 64 << 20 and tc.parse_size("512k") == 512 << 10
    for bad in ("0s", "61s", "2h", "ten"):
        with pytest.raises(tc.TraceError, match="duration"):
            tc.parse_duration(bad)
    for bad in ("1k", f"{(tc.HARD_MAX_BYTES >> 20) + 1}M", "lots"):
        with pytest.raises(tc.TraceError, match="max size"):
            tc.parse_size(bad)
    with pytest.raises(tc.TraceError, match="either a pid or a unit"):
        tc.filter_tids(1, "x.service")
    # ring buffer: a third of the cap over all CPUs, within bounds
    assert tc.buffer_kb_per_cpu(64 << 20, cpus=2) == (64 << 20) // 3 // 2 // 1024
    assert tc.buffer_kb_per_cpu(64 << 20, cpus=256) == tc.BUFFER_KB_MIN
    assert tc.buffer_kb_per_cpu(tc.HARD_MAX_BYTES, cpus=1) == tc.BUFFER_KB_MAX
    assert tc.filter_tids(None, None) == []
    assert tc.filter_tids(os.getpid(), None) == sorted(int(t) for t in os.listdir("/proc/self/task"))


def test_the_ring_buffer_is_sized_by_the_machine_shapes_online_cpus(monkeypatch):
    """The CPUs come from the shape's one reading of them; where it cannot be read the capture
    says so, instead of guessing a count."""
    monkeypatch.setattr(tc, "online_cpus", lambda: (0, 1, 2))
    assert tc._online_count() == 3

    def unreadable():
        raise tc.ShapeError("/sys/devices/system/cpu/online: missing")

    monkeypatch.setattr(tc, "online_cpus", unreadable)
    with pytest.raises(tc.TraceError, match="cannot size the trace buffers: .*online: missing"):
        tc._online_count()
