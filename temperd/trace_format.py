"""The ftrace text format that the Perfetto UI (and trace_processor) imports, and the regular
expressions that read it back.

One event per line, the kernel's own `trace` layout:

    <comm>-<tid> (<tgid>) [<cpu>] <flags> <seconds>.<micros>: <event>: <fields>

Perfetto recognises the file by `# tracer` near its start, skips lines that begin with `#`, and
finds the line head with a search for `-TID (TGID) [CPU] FLAGS TS: EVENT:`; everything before it
is the thread name (which may hold spaces and dashes). Older importers allow at most four flag
characters while kernels >= 5.18 print five (migrate-disable), so lines are written with the
classic four. Thread names the kernel did not know (`<...>`) and unknown thread groups
(`-------`) are filled in from the trace itself and from /proc, so the UI groups threads under
their process and names them.
"""

from __future__ import annotations

import gzip
import io
import os
import re
from dataclasses import dataclass, field
from typing import IO, Dict, Optional, Tuple

from . import procfs

HEADER_FIRST_LINE = "# tracer: nop"
UNKNOWN_COMM = "<...>"
UNKNOWN_TGID = "-------"

# A line as the kernel prints it (trace and trace_pipe, with record-tgid on or off).
KERNEL_LINE = re.compile(
    r"^\s*(.*)-(\d+)\s+(?:\(\s*(\d+|-+)\)\s+)?\[(\d+)\]\s+(?:([a-zA-Z0-9.]{1,6})\s+)?(\d+\.\d+): ([^\s:]+): ?(.*)$")

# A line as this module writes it: what the tests hold the output to.
WRITTEN_LINE = re.compile(
    r"^ *(?P<comm>.+)-(?P<tid>\d+) +\( *(?P<tgid>\d+|-+)\) \[(?P<cpu>\d{3,})\] (?P<flags>[a-zA-Z0-9.]{4}) +"
    r"(?P<ts>\d+\.\d{6}): (?P<event>[^\s:]+): (?P<fields>.*)$")

# Perfetto's own head search (systrace_line_tokenizer): every written line must satisfy it.
PERFETTO_HEAD = re.compile(
    r"-(\d+)\s+\(?\s*(\d+|-+)?\)?\s?\[(\d+)\]\s*[a-zA-Z0-9.]{0,4}\s+(\d+\.\d+):\s+(\S+):")

# trace_pipe reports ring-buffer overruns in-line.
LOST_LINE = re.compile(r"^CPU:(\d+) \[LOST (\d+) EVENTS\]")

# Event fields that carry thread names (comm may contain spaces: match up to the next key).
SWITCH_FIELDS = re.compile(
    r"prev_comm=(.*) prev_pid=(\d+) prev_prio=(-?\d+) prev_state=(\S+) ==> next_comm=(.*) next_pid=(\d+) next_prio=")
WAKE_FIELDS = re.compile(r"comm=(.*) pid=(\d+) prio=")
FORK_FIELDS = re.compile(r"comm=(.*) pid=(\d+) child_comm=(.*) child_pid=(\d+)")
RENAME_FIELDS = re.compile(r"pid=(\d+) oldcomm=(.*) newcomm=(.*) oom_score_adj=")

# Above this much text, the output is gzip-compressed (Perfetto opens .gz traces directly).
COMPRESS_ABOVE_BYTES = 32 * 1024 * 1024


class NameBook:
    """tid -> thread name and tid -> tgid, learned from event fields as lines go by and, for
    threads still alive, from /proc. Bounded by the number of threads seen."""

    def __init__(self, proc_lookup: bool = True):
        self.comm: Dict[int, str] = {}
        self.tgid: Dict[int, int] = {}
        self._asked: Dict[int, Optional[int]] = {}
        self.proc_lookup = proc_lookup

    def learn(self, event: str, fields: str) -> None:
        if event == "sched_switch":
            m = SWITCH_FIELDS.match(fields)
            if m:
                self.comm[int(m.group(2))] = m.group(1)
                self.comm[int(m.group(6))] = m.group(5)
        elif event in ("sched_waking", "sched_wakeup", "sched_wakeup_new"):
            m = WAKE_FIELDS.match(fields)
            if m:
                self.comm[int(m.group(2))] = m.group(1)
        elif event == "sched_process_fork":
            m = FORK_FIELDS.match(fields)
            if m:
                self.comm[int(m.group(4))] = m.group(3)
        elif event == "task_rename":
            m = RENAME_FIELDS.match(fields)
            if m:
                self.comm[int(m.group(1))] = m.group(3)

    def tgid_of(self, tid: int) -> Optional[int]:
        known = self.tgid.get(tid)
        if known is not None or not self.proc_lookup:
            return known
        if tid not in self._asked:
            self._asked[tid] = _tgid_from_proc(tid)
        return self._asked[tid]


def _tgid_from_proc(tid: int) -> Optional[int]:
    if tid == 0:
        return 0
    data = procfs.read_bytes(f"{procfs.PROC}/{tid}/status")
    if not data:
        return None
    marker = data.find(b"\nTgid:")
    if marker < 0:
        return None
    try:
        return int(data[marker + 6:].split(b"\n", 1)[0])
    except ValueError:
        return None


def format_line(comm: str, tid: int, tgid: Optional[int], cpu: int, flags: str, ts: str,
                event: str, fields: str) -> str:
    tgid_text = UNKNOWN_TGID if tgid is None else str(tgid)
    return f"{comm:>16}-{tid:<7} ({tgid_text:>7}) [{cpu:03d}] {flags} {ts:>12}: {event}: {fields}\n"


def header(notes: Dict[str, str]) -> str:
    """The first lines: `# tracer: nop` (how Perfetto recognises the format), capture notes as
    comments, and the kernel's column legend."""
    lines = [HEADER_FIRST_LINE, "#"]
    lines += [f"# {key}: {value}" for key, value in notes.items()]
    lines += [
        "#",
        "#                                          _-----=> irqs-off",
        "#                                         / _----=> need-resched",
        "#                                        | / _---=> hardirq/softirq",
        "#                                        || / _--=> preempt-depth",
        "#           TASK-PID       TGID    CPU#  ||||    TIMESTAMP  FUNCTION",
        "#              | |           |       |   ||||       |         |",
    ]
    return "\n".join(lines) + "\n"


@dataclass
class FormatStats:
    events: int = 0
    by_event: Dict[str, int] = field(default_factory=dict)
    lost_events: int = 0  # reported in-line by trace_pipe
    skipped_lines: int = 0  # neither an event nor a loss report
    bytes_text: int = 0


class TraceWriter:
    """Normalises kernel lines and writes them, plain or gzip, to a temporary file that
    close() moves into place, so a reader never sees half a trace."""

    def __init__(self, path: str, notes: Dict[str, str], compress: bool, names: Optional[NameBook] = None):
        self.path = path
        self.compress = compress
        self.names = names or NameBook()
        self.stats = FormatStats()
        self._tmp = f"{path}.partial-{os.getpid()}"
        raw = open(self._tmp, "wb")
        self._out: IO[bytes] = gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=6, mtime=0) \
            if compress else raw
        self._raw = raw
        self._text = io.TextIOWrapper(self._out, encoding="utf-8", errors="replace", newline="\n",
                                      write_through=False)
        self._emit(header(notes))

    def _emit(self, text: str) -> None:
        self._text.write(text)
        self.stats.bytes_text += len(text)

    def feed(self, line: str) -> None:
        """One kernel line (without its newline)."""
        m = KERNEL_LINE.match(line)
        if m is None:
            lost = LOST_LINE.match(line)
            if lost:
                self.stats.lost_events += int(lost.group(2))
            elif line.strip() and not line.startswith("#"):
                self.stats.skipped_lines += 1
            return
        comm, tid_s, tgid_s, cpu_s, flags, ts, event, fields = m.groups()
        tid = int(tid_s)
        names = self.names
        names.learn(event, fields)
        if comm == UNKNOWN_COMM:
            comm = names.comm.get(tid, comm)
        tgid: Optional[int] = int(tgid_s) if tgid_s and tgid_s[0] != "-" else None
        if tgid is None:
            tgid = names.tgid_of(tid)
        elif tid not in names.tgid:
            names.tgid[tid] = tgid
        flags = (flags or "....")[:4].ljust(4, ".")
        self._emit(format_line(comm, tid, tgid, int(cpu_s), flags, ts, event, fields))
        stats = self.stats
        stats.events += 1
        stats.by_event[event] = stats.by_event.get(event, 0) + 1

    def close(self) -> None:
        self._text.flush()
        self._text.detach()
        if self._out is not self._raw:
            self._out.close()
        self._raw.flush()
        os.fsync(self._raw.fileno())
        self._raw.close()
        os.replace(self._tmp, self.path)

    def abort(self) -> None:
        try:
            self._text.detach()
        except ValueError:
            pass
        for stream in (self._out, self._raw):
            try:
                stream.close()
            except OSError:
                pass
        try:
            os.unlink(self._tmp)
        except OSError:
            pass


def output_path(requested: str, text_bytes: int) -> Tuple[str, bool]:
    """Where the trace goes and whether it is compressed: always for a .gz name, and for a large
    trace (a .gz suffix is then added so the name says what the file holds)."""
    if requested.endswith(".gz"):
        return requested, True
    if text_bytes > COMPRESS_ABOVE_BYTES:
        return requested + ".gz", True
    return requested, False


def open_text(path: str) -> IO[str]:
    """A trace for reading, plain or gzip (by its magic bytes, not its name)."""
    with open(path, "rb") as probe:
        magic = probe.read(2)
    if magic == b"\x1f\x8b":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", errors="replace")
    return open(path, encoding="utf-8", errors="replace")
