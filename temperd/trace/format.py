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

Process names have no place in that line format, so the file is the systrace HTML container
Perfetto also imports (recognised by `<!DOCTYPE html>` at its start): a `trace-data` section
with a PROCESS DUMP (`USER PID PPID VSZ RSS WCHAN PC S NAME COMMAND`, one row per process seen
in the trace: its name and command line), then a `trace-data` section holding the ftrace text
above. Perfetto reads the dump only before the ftrace section and stops at that section's end,
so the order is fixed. `event_lines` gives back the ftrace text of either form.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import itertools
import os
import pwd
import re
import shutil
from dataclasses import dataclass, field
from typing import IO, Dict, Iterable, Iterator, Optional, Set, Tuple

from temperd.sources import procfs
from temperd.text import printable, printable_lines

HEADER_FIRST_LINE = "# tracer: nop"
UNKNOWN_COMM = "<...>"
UNKNOWN_TGID = "-------"

# A line's head as the kernel prints it (trace and trace_pipe, record-tgid on or off), the event's fields after
# it; the comm is matched lazily up to the first "-TID (" or "-TID [" so names with dashes survive.
LINE_HEAD = re.compile(r"\s*(.*?)-(\d+)\s+(?:\(\s*(\d+|-+)\)\s+)?\[(\d+)\]\s+(?:([a-zA-Z0-9.]{1,6})\s+)?(\d+)\.(\d+): ([^\s:]+): ?")

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

# The systrace HTML container (see the module docstring).
HTML_START = "<!DOCTYPE html>"
SECTION_START = '<script class="trace-data" type="application/text">'
SECTION_END = "</script>"
PROCESS_DUMP_TITLE = "PROCESS DUMP"
PROCESS_DUMP_HEADER = "USER PID PPID VSZ RSS WCHAN PC S NAME COMMAND"
MAX_COMMAND_CHARS = 512


class NameBook:
    """tid -> thread name and tid -> tgid, learned from event fields as lines go by and, for
    threads still alive, from /proc. Bounded by the number of threads seen."""

    def __init__(self) -> None:
        self.comm: Dict[int, str] = {}
        self.tgid: Dict[int, int] = {}
        self._asked: Dict[int, Optional[int]] = {}

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
        if known is not None:
            return known
        if tid not in self._asked:
            self._asked[tid] = _tgid_from_proc(tid)
        return self._asked[tid]


def _tgid_from_proc(tid: int) -> Optional[int]:
    if tid == 0:
        return 0
    tgid = procfs.status_fields(procfs.read_bytes(f"{procfs.PROC}/{tid}/status")).get(b"Tgid")
    try:
        return int(tgid) if tgid is not None else None
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


def process_row(pid: int, names: "NameBook") -> str:
    """One PROCESS DUMP row: Perfetto takes the 2nd and 3rd tokens as pid and ppid, the 9th as
    the process name and the rest as its command line; the columns between are placeholders."""
    found = procfs.status_fields(procfs.read_bytes(f"{procfs.PROC}/{pid}/status"))
    name = (found.get(b"Name", b"").decode("utf-8", "replace") or names.comm.get(pid) or f"pid{pid}")
    ppid = int(found.get(b"PPid", b"0") or 0)
    try:
        user = pwd.getpwuid(int(found.get(b"Uid", b"0").split()[0])).pw_name
    except (KeyError, ValueError, IndexError):
        user = "-"
    # One line: arguments may hold newlines (python -c '...'), which would end the row early.
    cmdline = (procfs.read_bytes(f"{procfs.PROC}/{pid}/cmdline") or b"").decode("utf-8", "replace")
    command = " ".join(cmdline.replace("\0", " ").split())[:MAX_COMMAND_CHARS] or f"[{name}]"
    name = "_".join(name.split()) or "-"  # one token
    return f"{user} {pid} {ppid} 0 0 0 0 S {printable(name)} {printable(command)}\n"


def html_head(process_rows: Iterable[str]) -> str:
    return (f"{HTML_START}\n<html>\n<head><meta charset=\"utf-8\"><title>temperd trace</title></head>\n<body>\n"
            f"{SECTION_START}\n{PROCESS_DUMP_TITLE}\n{PROCESS_DUMP_HEADER}\n" + "".join(process_rows) +
            f"{SECTION_END}\n{SECTION_START}\n")


HTML_TAIL = f"{SECTION_END}\n</body>\n</html>\n"


def event_lines(lines: Iterable[str]) -> Iterator[str]:
    """The ftrace text of a trace: all of a plain one, the ftrace section of an HTML one."""
    it = iter(lines)
    first = next(it, None)
    if first is None:
        return iter(())
    if not first.startswith("<"):
        return itertools.chain((first,), it)  # no Python step per line: the parser's hot loop
    return _ftrace_section(it)


def _ftrace_section(it: Iterator[str]) -> Iterator[str]:
    in_trace = False
    for line in it:
        if in_trace:
            if line.startswith(SECTION_END):
                return
            yield line
        elif line.startswith("#") and "TASK-PID" in line:
            in_trace = True


@dataclass
class FormatStats:
    events: int = 0
    by_event: Dict[str, int] = field(default_factory=dict)
    lost_events: int = 0  # reported in-line by trace_pipe
    bytes_text: int = 0


class TraceWriter:
    """Normalises kernel lines and writes them, plain or gzip, to a temporary file that
    close() moves into place, so a reader never sees half a trace."""

    def __init__(self, path: str, notes: Dict[str, str], compress: bool):
        self.path = path
        self.compress = compress
        self.names = NameBook()
        self.stats = FormatStats()
        self.processes: Set[int] = set()  # thread groups seen, for the process dump
        # The ftrace section goes to a body file first: the process dump that must precede it
        # is known only at the end.
        self._body_path = f"{path}.body-{os.getpid()}"
        self._tmp = f"{path}.partial-{os.getpid()}"
        self._text = open(self._body_path, "w", encoding="utf-8", errors="replace", newline="\n")
        self._emit(header(notes))

    def _emit(self, text: str) -> None:
        self._text.write(text)
        self.stats.bytes_text += len(text)

    def feed(self, line: str) -> None:
        """One kernel line (without its newline)."""
        m = LINE_HEAD.match(line)
        if m is None:
            lost = LOST_LINE.match(line)
            if lost:
                self.stats.lost_events += int(lost.group(2))
            return
        comm, tid_s, tgid_s, cpu_s, flags, sec, frac, event = m.groups()
        ts, fields = f"{sec}.{frac}", line[m.end():]
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
        if tgid:
            self.processes.add(tgid)
        flags = (flags or "....")[:4].ljust(4, ".")
        # Thread names are anyone's to choose: control characters go into the file escaped.
        self._emit(printable_lines(format_line(comm, tid, tgid, int(cpu_s), flags, ts, event, fields)))
        stats = self.stats
        stats.events += 1
        stats.by_event[event] = stats.by_event.get(event, 0) + 1

    def close(self) -> None:
        """Assemble the file (HTML head with the process dump, the ftrace section, the tail)."""
        self._text.close()
        head = html_head(process_row(pid, self.names) for pid in sorted(self.processes))
        with open(self._tmp, "wb") as raw:
            out: IO[bytes] = gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=6, mtime=0) \
                if self.compress else raw
            out.write(head.encode("utf-8"))
            with open(self._body_path, "rb") as body:
                shutil.copyfileobj(body, out, 1 << 20)
            out.write(HTML_TAIL.encode("utf-8"))
            if out is not raw:
                out.close()
            raw.flush()
            os.fsync(raw.fileno())
        os.replace(self._tmp, self.path)
        os.unlink(self._body_path)

    def abort(self) -> None:
        with contextlib.suppress(OSError):
            self._text.close()
        for leftover in (self._body_path, self._tmp):
            with contextlib.suppress(OSError):
                os.unlink(leftover)


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
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", errors="replace", newline="\n")
    # Lines end at "\n" alone: a \r of a thread's name ends none (kernel_lines).
    return open(path, encoding="utf-8", errors="replace", newline="\n")
