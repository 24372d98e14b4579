"""Bounded kernel scheduling-trace capture through tracefs.

A capture works in a private tracefs instance (instances/temperd-<pid>-<n>) with its own ring
buffer, events, pid filter and clock, so the host's global buffer (tracing_on, current_tracer,
set_event) and other tracing users are not touched. It streams the instance's trace_pipe into a
file for at most the requested duration and size, then writes the ftrace text format that the
Perfetto UI opens (format.py). One capture runs per host: an flock'd lock file names the
holder, and a second request is refused with that name rather than queued. The instance is
removed in `finally`; one left by a capture that was killed is removed by
cleanup_stale_instances() (temperd calls it at start).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import itertools
import json
import os
import re
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, Sequence

from temperd import paths
from temperd.control.protocol import Progress
from temperd.files import kernel_lines
from temperd.sources.mounts import tracefs_mount
from temperd.sources import host_cpu, procfs
from temperd.sources.facts import UNIT_SUFFIXES
from temperd.sources.shape import ShapeError, online_cpus
from temperd.trace.format import TraceWriter, output_path

TRACEFS_PATHS = ("/sys/kernel/tracing", "/sys/kernel/debug/tracing")
LOCK_PATH = paths.TRACE_LOCK
INSTANCE_PREFIX = "temperd-"
_INSTANCE_NAME = re.compile(r"^temperd-(\d+)-(\d+)$")

DEFAULT_DURATION_S = 10.0
MAX_DURATION_S = 60.0
DEFAULT_MAX_BYTES = 64 * 1024 * 1024  # uncompressed trace text
HARD_MAX_BYTES = 256 * 1024 * 1024
# The instance's ring buffer per CPU: about a third of the size cap over all CPUs (a binary
# event is about a third of its text), so a burst the reader cannot keep up with is held rather
# than lost; within these bounds.
BUFFER_KB_MIN = 1024
BUFFER_KB_MAX = 16384
READ_CHUNK = 1 << 20
POLL_S = 0.05
PROGRESS_EVERY_S = 0.5

# (subsystem/event, required): sched_switch is the one a trace is useless without.
EVENTS = (
    ("sched/sched_switch", True),
    ("sched/sched_waking", False),
    ("sched/sched_wakeup", False),
    ("sched/sched_wakeup_new", False),
    ("sched/sched_migrate_task", False),
    ("sched/sched_process_fork", False),
    ("sched/sched_process_exec", False),
    ("sched/sched_process_exit", False),
    ("task/task_rename", False),
)


class TraceError(Exception):
    """A capture that cannot run or failed; the message is one line for the user."""


class CaptureBusy(TraceError):
    """Another capture holds the host's trace lock."""


@dataclass(frozen=True)
class CaptureRequest:
    output: str
    duration_s: float = DEFAULT_DURATION_S
    max_bytes: int = DEFAULT_MAX_BYTES
    pid: Optional[int] = None
    unit: Optional[str] = None
    requester: str = "temperctl"


@dataclass
class CaptureResult:
    output: str
    compressed: bool
    file_bytes: int
    text_bytes: int
    events: int
    by_event: Dict[str, int]
    lost_events: int
    duration_s: float
    stopped_by: str  # duration | size
    instance: str
    filter_pids: List[int] = field(default_factory=list)
    events_enabled: List[str] = field(default_factory=list)

    def as_dict(self) -> Dict[str, Any]:
        return asdict(self)


# ---- limits --------------------------------------------------------------------------------------

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m)?\s*$")
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmg]i?b?|b)?\s*$", re.IGNORECASE)


def parse_duration(text: Any) -> float:
    """'10s', '500ms', '1m' or a number of seconds -> seconds within (0, MAX_DURATION_S]."""
    m = _DURATION.match(str(text))
    if not m:
        raise TraceError(f"duration: expected e.g. 10s, 500ms or 1m, found {text!r}")
    seconds = float(m.group(1)) * {"ms": 0.001, "s": 1.0, "m": 60.0, None: 1.0}[m.group(2)]
    if not 0 < seconds <= MAX_DURATION_S:
        raise TraceError(f"duration: expected more than 0 and at most {MAX_DURATION_S:g} s, found {text}")
    return seconds


def parse_size(text: Any) -> int:
    """'64M', '512k', '1G' or a number of bytes -> bytes within [64 KiB, HARD_MAX_BYTES]."""
    m = _SIZE.match(str(text))
    if not m:
        raise TraceError(f"max size: expected e.g. 64M, 512k or a number of bytes, found {text!r}")
    unit = (m.group(2) or "b")[0].lower()
    value = float(m.group(1)) * {"b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[unit]
    if not 64 * 1024 <= value <= HARD_MAX_BYTES:  # before int(): a long digit string is inf
        raise TraceError(f"max size: expected 64k to {HARD_MAX_BYTES >> 20}M, found {text}")
    return int(value)


# ---- tracefs -------------------------------------------------------------------------------------


def find_tracefs(mount: bool = True) -> str:
    """The tracefs mount point; mounts it at /sys/kernel/tracing when nothing has (as systemd
    would at boot). Raises TraceError when the kernel has no tracefs or we may not mount it."""
    found = tracefs_mount()
    if found and os.path.isdir(os.path.join(found, "instances")):
        return found
    for path in TRACEFS_PATHS:
        if os.path.isdir(os.path.join(path, "instances")):
            return path
    if not mount:
        raise TraceError("tracefs is not mounted")
    target = TRACEFS_PATHS[0]
    if not os.path.isdir(target):
        raise TraceError(f"cannot mount tracefs: {target} does not exist (kernel without CONFIG_TRACING?)")
    import subprocess

    try:
        done = subprocess.run(["mount", "-t", "tracefs", "nodev", target], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise TraceError(f"cannot mount tracefs on {target}: {exc}") from None
    if done.returncode != 0 or not os.path.isdir(os.path.join(target, "instances")):
        raise TraceError(f"cannot mount tracefs on {target}: {done.stderr.strip() or 'mount failed'}")
    return target


def buffer_kb_per_cpu(max_bytes: int, cpus: int) -> int:
    return max(BUFFER_KB_MIN, min(BUFFER_KB_MAX, max_bytes // 3 // cpus // 1024))


def _online_count() -> int:
    try:
        return len(online_cpus())
    except ShapeError as exc:
        raise TraceError(f"cannot size the trace buffers: {exc}") from None


def _write(path: str, value: str) -> None:
    try:
        with open(path, "w") as handle:
            handle.write(value)
    except OSError as exc:
        raise TraceError(f"cannot write {value.strip()!r} to {path}: {exc.strerror}") from None


def _read(path: str) -> str:
    with open(path, newline="") as handle:
        return handle.read()


def _remove_instance(path: str) -> None:
    """rmdir of a tracefs instance; EBUSY while a reader still closes its trace_pipe: retry."""
    for attempt in range(50):
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY or attempt == 49:
                raise
            time.sleep(0.02)


_counter = itertools.count(1)


class Instance:
    """A private tracefs instance owned by this process; its name encodes our pid so a later
    start can tell a leftover of a dead capture from a running one."""

    def __init__(self, tracefs: str):
        self.tracefs = tracefs
        while True:
            self.name = f"{INSTANCE_PREFIX}{os.getpid()}-{next(_counter)}"
            self.path = os.path.join(tracefs, "instances", self.name)
            try:
                os.mkdir(self.path)
                break
            except FileExistsError:
                continue
            except OSError as exc:
                raise TraceError(f"cannot create tracefs instance {self.path}: {exc.strerror}") from None
        self.enabled: List[str] = []

    def configure(self, filter_tids: Sequence[int], max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        _write(self._file("tracing_on"), "0")
        _write(self._file("buffer_size_kb"), str(buffer_kb_per_cpu(max_bytes, _online_count())))
        clocks = _read(self._file("trace_clock"))
        if "mono" in clocks.replace("[", " ").replace("]", " ").split():
            _write(self._file("trace_clock"), "mono")  # CLOCK_MONOTONIC: what Perfetto assumes
        for option in ("record-tgid", "event-fork" if filter_tids else ""):
            if option and os.path.exists(self._file("options", option)):
                _write(self._file("options", option), "1")
        if filter_tids:
            _write(self._file("set_event_pid"), " ".join(map(str, filter_tids)))
        for event, required in EVENTS:
            enable = self._file("events", event, "enable")
            if not os.path.exists(enable):
                if required:
                    raise TraceError(f"this kernel has no {event} trace event")
                continue
            _write(enable, "1")
            self.enabled.append(event.split("/", 1)[1])

    def _file(self, *parts: str) -> str:
        return os.path.join(self.path, *parts)

    def start(self) -> None:
        _write(self._file("tracing_on"), "1")

    def stop(self) -> None:
        with contextlib.suppress(TraceError):
            _write(self._file("tracing_on"), "0")

    def lost_events(self) -> int:
        """Events the ring buffer had to drop (overrun) per the per-CPU stats."""
        total = 0
        per_cpu = self._file("per_cpu")
        for cpu in os.listdir(per_cpu) if os.path.isdir(per_cpu) else ():
            try:
                text = _read(os.path.join(per_cpu, cpu, "stats"))
            except OSError:
                continue
            for line in kernel_lines(text):
                key, _, value = line.partition(":")
                if key.strip() in ("overrun", "dropped events"):
                    with contextlib.suppress(ValueError):
                        total += int(value)
        return total

    def remove(self) -> None:
        self.stop()
        _remove_instance(self.path)


# ---- one capture per host ------------------------------------------------------------------------


def describe_holder(holder: Dict[str, Any]) -> str:
    started = holder.get("started_at")
    when = time.strftime("%H:%M:%S", time.localtime(started)) if isinstance(started, (int, float)) else "?"
    return (f"pid {holder.get('pid', '?')}, requested by {holder.get('requester', '?')}, started {when}, "
            f"{holder.get('duration_s', '?')} s, writing {holder.get('output', '?')}")


_EMPTY_HOLDER_WAIT_S = 0.5  # how long a lock held with no holder written may be looked at again


class CaptureLock:
    """flock on LOCK_PATH for the length of a capture; the file names the holder in JSON.

    flock belongs to the open file, so two captures in one process (two daemon threads) exclude
    each other too, and the kernel drops the lock when the holder dies."""

    def __init__(self, holder: Dict[str, Any], path: Optional[str] = None):
        self.path = path or LOCK_PATH
        self.holder = holder
        self._fd: Optional[int] = None

    def __enter__(self) -> "CaptureLock":
        os.makedirs(os.path.dirname(self.path), mode=0o755, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        # An empty file under a held lock is another capture between its flock and its holder line
        # (or a reader's shared lock, held for an instant): look again shortly before refusing.
        deadline = time.monotonic() + _EMPTY_HOLDER_WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                text = os.pread(fd, 64 * 1024, 0).decode("utf-8", "replace")
                if not text.strip() and time.monotonic() < deadline:
                    time.sleep(0.01)
                    continue
                os.close(fd)
                try:
                    holder = json.loads(text)
                except ValueError:
                    holder = {}
                what = describe_holder(holder) if holder else "it is just starting"
                raise CaptureBusy(f"a trace capture is already running ({what}); one at a time per host, "
                                  "try again when it ends") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(self.holder).encode() + b"\n", 0)
        self._fd = fd
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            os.close(self._fd)  # releases the flock
            self._fd = None


# ---- whose events --------------------------------------------------------------------------------


def unit_pids(unit: str) -> List[int]:
    """Processes whose cgroup belongs to the systemd unit (a bare name means NAME.service)."""
    if not unit.endswith(UNIT_SUFFIXES):
        unit += ".service"
    return [pid for pid in procfs.list_pids() if getattr(procfs.read_cgroup(pid), "unit", None) == unit]


def filter_tids(pid: Optional[int], unit: Optional[str]) -> List[int]:
    """The thread ids for set_event_pid (the kernel filters by thread, not by process): those of
    the unit's processes, or of the process and the processes it has forked (a PostgreSQL
    postmaster's backends); empty when the capture is host-wide. Raises TraceError when the
    workload has no live process."""
    if pid is None and not unit:
        return []
    if pid is not None and unit:
        raise TraceError("give either a pid or a unit, not both")
    pids = procfs.process_tree(pid) if pid is not None else unit_pids(str(unit))
    tids: List[int] = []
    for one in pids:
        tids.extend(procfs.list_tids(one) or [])
    if not tids:
        raise TraceError(f"no process with pid {pid}" if pid is not None else f"unit {unit} has no running processes")
    return sorted(set(tids))


# ---- capture -------------------------------------------------------------------------------------


def check_request(request: CaptureRequest) -> None:
    if not 0 < request.duration_s <= MAX_DURATION_S:
        raise TraceError(f"duration: expected more than 0 and at most {MAX_DURATION_S:g} s, found {request.duration_s:g}")
    if not 64 * 1024 <= request.max_bytes <= HARD_MAX_BYTES:
        raise TraceError(f"max size: expected 64k to {HARD_MAX_BYTES >> 20}M, found {request.max_bytes} bytes")
    directory = os.path.dirname(os.path.abspath(request.output))
    if not os.path.isdir(directory):
        raise TraceError(f"output: directory {directory} does not exist")
    if os.geteuid() != 0:
        raise TraceError("trace capture needs root (tracefs); run temperctl trace as root or through temperd")


def capture(request: CaptureRequest, progress: Optional[Progress] = None,
            cancel: Optional[threading.Event] = None) -> CaptureResult:
    """Run one bounded capture and write request.output (or output + .gz when large).

    progress gets {"elapsed_s", "duration_s", "events", "bytes"} about twice a second; an
    exception from it (a client that went away) or cancel being set ends the capture early,
    with everything cleaned up."""
    check_request(request)
    tids = filter_tids(request.pid, request.unit)
    holder = {"pid": os.getpid(), "started_at": time.time(), "requester": request.requester,
              "output": request.output, "duration_s": request.duration_s,
              "filter": (f"pid {request.pid}" if request.pid is not None
                         else f"unit {request.unit}" if request.unit else "host")}
    with CaptureLock(holder):
        root = find_tracefs()
        raw_path = f"{request.output}.raw-{os.getpid()}"
        try:
            instance = Instance(root)
            try:
                instance.configure(tids, request.max_bytes)
                with open(raw_path, "wb") as raw:
                    text_bytes, elapsed, stopped_by = _stream(instance, raw, request, progress, cancel)
                lost = instance.lost_events()
            finally:
                instance.remove()
            notes = {"captured by": f"temperd trace capture ({request.requester})",
                     "filter": holder["filter"],
                     "events": ", ".join(instance.enabled),
                     "duration_s": f"{elapsed:.3f} (stopped by {stopped_by})",
                     "clock": "mono"}
            path, compressed = output_path(request.output, text_bytes)
            writer = TraceWriter(path, notes, compressed)
            try:
                with open(raw_path, encoding="utf-8", errors="replace", newline="\n") as lines:
                    for line in lines:
                        writer.feed(line.rstrip("\n"))
                os.unlink(raw_path)  # before assembling the file: at most two copies on disk at once
                writer.close()
            except BaseException:
                writer.abort()
                raise
        finally:
            with contextlib.suppress(OSError):
                os.unlink(raw_path)
    stats = writer.stats
    return CaptureResult(output=path, compressed=compressed, file_bytes=os.path.getsize(path),
                         text_bytes=stats.bytes_text, events=stats.events, by_event=dict(sorted(stats.by_event.items())),
                         lost_events=lost + stats.lost_events, duration_s=round(elapsed, 3), stopped_by=stopped_by,
                         instance=instance.name, filter_pids=tids, events_enabled=instance.enabled)


class _Sink:
    """Whole lines from trace_pipe into the raw file, never past the size cap."""

    def __init__(self, raw, max_bytes: int):
        self.raw = raw
        self.max_bytes = max_bytes
        self.written = 0
        self.events = 0
        self.tail = b""

    def add(self, chunk: bytes) -> bool:
        """False when the cap is reached (what did not fit is dropped)."""
        data = self.tail + chunk
        cut = data.rfind(b"\n") + 1
        data, self.tail = data[:cut], data[cut:]
        room = self.max_bytes - self.written
        fits = len(data) <= room
        if not fits:
            data = data[:data.rfind(b"\n", 0, room) + 1]
        self.raw.write(data)
        self.written += len(data)
        self.events += data.count(b"\n")
        return fits


def _stream(instance: Instance, raw, request: CaptureRequest, progress: Optional[Progress],
            cancel: Optional[threading.Event]):
    """Copy trace_pipe to raw until the duration or size limit; returns (bytes, seconds, why)."""
    fd = os.open(os.path.join(instance.path, "trace_pipe"), os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    sink = _Sink(raw, request.max_bytes)
    stopped_by = "duration"
    try:
        instance.start()
        started = time.monotonic()
        deadline = started + request.duration_s
        next_note = started + PROGRESS_EVERY_S
        while True:
            now = time.monotonic()
            if now >= deadline:
                break
            if cancel is not None and cancel.is_set():
                stopped_by = "cancel"
                break
            chunk = _read_available(fd)
            if chunk and not sink.add(chunk):
                stopped_by = "size"
                break
            if not chunk:
                time.sleep(POLL_S)
            if progress is not None and now >= next_note:
                progress({"elapsed_s": round(now - started, 1), "duration_s": request.duration_s,
                          "events": sink.events, "bytes": sink.written})
                next_note = now + PROGRESS_EVERY_S
        elapsed = time.monotonic() - started
        instance.stop()
        while stopped_by == "duration":  # what the buffer still holds was recorded in the window
            chunk = _read_available(fd)
            if not chunk:
                break
            if not sink.add(chunk):
                stopped_by = "size"
    finally:
        os.close(fd)
    return sink.written, elapsed, stopped_by


def _read_available(fd: int) -> bytes:
    try:
        return os.read(fd, READ_CHUNK)
    except BlockingIOError:
        return b""


# ---- leftovers -----------------------------------------------------------------------------------


def _creator_alive(pid: int, created_at: float) -> bool:
    """The pid in an instance name still runs the process that made it: alive, and started
    before the instance was created (a newer process with that pid is a reuse)."""
    stat = procfs.read_task_stat(pid, pid)
    if stat is None:
        return False
    started_at = host_cpu.read_stat().boot_time + stat.start_time / procfs.CLOCK_TICKS
    return started_at <= created_at + 1.0


def cleanup_stale_instances() -> List[str]:
    """Remove temperd-<pid>-<n> instances whose capturing process is gone; returns their names.
    Instances of live captures and of other tools are left alone. Nothing to do (and no
    mount) when tracefs is not mounted."""
    try:
        tracefs = find_tracefs(mount=False)
    except TraceError:
        return []
    instances = os.path.join(tracefs, "instances")
    removed = []
    for name in sorted(os.listdir(instances)):
        m = _INSTANCE_NAME.match(name)
        if not m:
            continue
        path = os.path.join(instances, name)
        try:
            created_at = os.stat(path).st_mtime
        except FileNotFoundError:
            continue
        if _creator_alive(int(m.group(1)), created_at):
            continue
        _remove_instance(path)
        removed.append(name)
    return removed
