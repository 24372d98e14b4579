"""The state file: what temperd changed and what was there before, on disk, for the next start.

A journal of JSON lines. The first is a header ({"version": 2, "writer_pid", "written_at"});
each later one says what changed since the lines before it:

- {"thread": {...}}: a thread's record as it is now (thread_settings.ThreadRecord.as_json;
  a record of an earlier version, with every kind's `original` and what it `applied`, is read too);
- {"gone": [tid, start_time]}: a thread no longer held;
- {"section": kind, "set": {part: {key: value}}, "drop": {part: [key, ...]}}: the entries of a
  held setting's section (held.py: its originals, written values, ...) that changed.

A batch of process events appends the lines of its own changes (one write): a fork storm makes
ten batches a second, and a whole rewrite at each one cost a core's tenth at a thousand held
threads. The file is written whole (temp file, rename) when it is new or when its appended lines
outnumber twice its live entries, so it stays within a few times the size of what it holds.

Nothing is synced to disk: every setting the file describes (a thread's, an autogroup's, a v1
cgroup's, a PM QoS bound, a --runtime cgroup weight) ends with the boot, so the file must outlive
a killed temperd, not a power cut, and the page cache keeps it for the next start.

Each line is written before the change it records is made, so a line that a kill cut short (the
last one, without its newline) announced a change that never happened: it is dropped on load.
An append that fails (no space left, an I/O error) is cut back to where it began and raises:
the caller makes none of the changes it recorded. A line that cannot be read costs its own
entry, not the file: load() replays the others and names the lines it skipped (`skipped`).
A file of version 1 (one JSON document, written by an earlier release) is read as well.

The file tells a root daemon what to set on any thread, so it is read only as temperd writes
it, checked on the opened file like temperd.toml: a regular file (never through a symbolic
link, a FIFO or a device), owned by the daemon's user, writable by nobody else. The journal is
read line by line, so its size costs no memory: a line over MAX_LINE_BYTES costs its own entry,
read through and never held. A file of version 1 is one document of at most MAX_FILE_BYTES.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import time
from typing import Any, BinaryIO, Dict, Iterable, Iterator, List, Mapping, Optional, Tuple

from temperd.config.errors import ConfigError
from temperd.config.tomlsource import open_checked
from temperd.files import remove_unfinished_writes, write_atomically

STATE_VERSION = 2
READ_VERSIONS = (1, STATE_VERSION)
COMPACT_AFTER = 256  # appended lines before a whole rewrite is considered (and at least twice the live entries)
# A thread's line is a few hundred bytes and the file a few times what it holds: tens of
# thousands of held threads fit many times over. A section line (every autogroup's entries) is
# the longest one temperd writes.
MAX_FILE_BYTES = 64 << 20
MAX_LINE_BYTES = 8 << 20
# What a start reads of a journal at most: the writer keeps it under MAX_FILE_BYTES, so more is
# damage; what lies past this bound is skipped and named, not read for minutes.
MAX_READ_BYTES = 4 * MAX_FILE_BYTES
_REST = b"\n"  # in place of a line: the rest of the file, past MAX_READ_BYTES (a real line has no newline)

ThreadKey = Tuple[int, int]
Sections = Dict[str, Dict[str, Dict[str, Any]]]  # kind -> part -> key -> value


class StateFileError(Exception):
    """The state file exists but cannot be used; the message names the file and the problem."""


# One encoder for every line: json.dumps(..., sort_keys=True) builds a new one per call, and
# the state file writes a line per record change (a fork storm: thousands a second).
_ENCODER = json.JSONEncoder(sort_keys=True, check_circular=False)


def _line(entry: Mapping[str, Any]) -> str:
    # Compact JSON: the C encoder (an indented dump runs in Python).
    return _ENCODER.encode(entry) + "\n"


class _Written:
    """One thread's line as the file holds it, and what it was made from."""

    __slots__ = ("record", "written", "drifted", "text")

    def __init__(self, record: Any):
        self.record = record
        self.written = dict(record.written)  # an original changes only with it
        self.drifted = dict(record.drifted)
        self.text = _line({"thread": record.as_json()})

    def matches(self, record: Any) -> bool:
        # A record's identity, pid and start never change; what it holds does.
        return record is self.record and record.written == self.written and record.drifted == self.drifted


class StateFile:
    def __init__(self, path: str):
        self.path = path
        self.directory = os.path.dirname(path) or "."
        self._threads: Dict[ThreadKey, _Written] = {}  # what the file holds, by thread
        self._sections: Sections = {}
        self._appended = 0  # lines after the last whole write
        self._complete = False  # whether _threads is what the file holds of every record (after a save)
        self._size: Optional[int] = None  # the file's length as this object last wrote it; None: write it whole
        self.skipped: List[int] = []  # the lines the last load() could not read (their entries are lost)
        self.whole_writes = 0  # since this object was made: how often the file was rewritten
        self.appends = 0

    # ---- writing ------------------------------------------------------------------------------

    def save(self, records: Mapping[ThreadKey, Any], sections: Mapping[str, Mapping[str, Any]],
             changed: Optional[Iterable[ThreadKey]] = None) -> None:
        """Make the file hold these thread records (by key; those that hold or found nothing are
        left out) and held-setting sections: append what changed, or write it whole. Removed
        when both are empty. changed: the keys of the only records that may differ from what
        the last save wrote (a fork storm's batch touches dozens of a thousand held threads);
        None: every record is compared."""
        lines: List[str] = []
        if changed is None or not self._complete:
            live = self._compare_all(records, lines)
            count = len(live)
        else:
            # Only the changed records' entries: the file's picture is updated in place once the
            # lines are written (a copy of it at each save cost as much as the save at a
            # thousand held threads, a fork storm's batch touching a few of them).
            updates = self._compare(records, changed, lines)
            live = None
            count = len(self._threads) + sum((written is not None) - (key in self._threads)
                                             for key, written in updates.items())
        now = {kind: {part: dict(values) for part, values in section.items() if values}
               for kind, section in sections.items() if section}
        lines.extend(_section_lines(self._sections, now))
        if not count and not now:
            self.delete()
            return
        if not lines and os.path.exists(self.path):
            return  # unchanged: no write and no sync
        entries = count + sum(len(values) for section in now.values() for values in section.values())
        data = "".join(lines).encode()
        compact = self._appended + len(lines) > max(COMPACT_AFTER, 2 * entries)
        if live is None:
            if not compact and self._append(data, len(lines)):
                live = _updated(self._threads, updates)
            else:  # a whole write that fails leaves the picture as the file still is
                live = _updated(dict(self._threads), updates)
                self._write_whole(live, now)
        elif compact or not self._append(data, len(lines)):
            self._write_whole(live, now)
        self._threads, self._sections, self._complete = live, now, True

    def _compare_all(self, records: Mapping[ThreadKey, Any], lines: List[str]) -> Dict[ThreadKey, "_Written"]:
        """What the file should hold of every record, and the lines that say what changed."""
        live: Dict[ThreadKey, _Written] = {}
        held = self._threads
        for key, record in records.items():
            if not (record.written or record.drifted):
                continue
            written = held.get(key)
            if written is None or not written.matches(record):
                written = _Written(record)
                lines.append(written.text)
            live[key] = written
        lines.extend(_line({"gone": list(key)}) for key in held if key not in live)
        return live

    def _compare(self, records: Mapping[ThreadKey, Any], changed: Iterable[ThreadKey],
                 lines: List[str]) -> Dict[ThreadKey, Optional["_Written"]]:
        """_compare_all for the `changed` records alone (the others are as the file holds them):
        what changes in the file's picture, by key (None: the entry goes)."""
        held = self._threads
        updates: Dict[ThreadKey, Optional[_Written]] = {}
        for key in changed:
            record = records.get(key)
            if record is None or not (record.written or record.drifted):
                if key in held and updates.get(key, held[key]) is not None:
                    updates[key] = None
                    lines.append(_line({"gone": list(key)}))
                continue
            written = updates.get(key, held.get(key))
            if written is None or not written.matches(record):
                updates[key] = written = _Written(record)
                lines.append(written.text)
        return updates

    def _append(self, data: bytes, count: int) -> bool:
        """Append `count` lines to the file as this object last wrote it; False where it did not
        write it, it is gone, or it is not as left (then it is written whole). An append that
        fails is cut back to where it began, so that the next load reads no part of it, and raises."""
        if self._size is None or self._size + len(data) > MAX_FILE_BYTES // 2:
            return False
        try:
            # O_NONBLOCK: a FIFO put in the file's place answers at once instead of waiting for a reader.
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ELOOP, errno.ENXIO):
                return False
            raise
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size != self._size:
                return False
            try:
                view = memoryview(data)
                while view:
                    written = os.write(fd, view)
                    if not written:
                        raise OSError(errno.EIO, "short write")
                    view = view[written:]
            except OSError:
                self._cut_back(fd, st.st_size)
                raise
        finally:
            os.close(fd)
        self._size += len(data)
        self._appended += count
        self.appends += 1
        return True

    def _cut_back(self, fd: int, size: int) -> None:
        """A failed append's part removed; where that fails too, the next save writes the file whole."""
        try:
            os.ftruncate(fd, size)
        except OSError:
            self._size = None

    def _write_whole(self, threads: Mapping[ThreadKey, _Written], sections: Sections) -> None:
        os.makedirs(self.directory, mode=0o700, exist_ok=True)
        header = _line({"version": STATE_VERSION, "writer_pid": os.getpid(), "written_at": time.time()})
        body = [written.text for written in threads.values()]
        body.extend(_line({"section": kind, "set": section}) for kind, section in sorted(sections.items()))
        data = (header + "".join(body)).encode()
        write_atomically(self.path, data, mode=0o600, durable=False)
        self._size = len(data)
        self._appended = 0
        self.whole_writes += 1

    def delete(self) -> None:
        self._threads, self._sections, self._appended = {}, {}, 0
        self._complete, self._size = False, None
        try:
            os.unlink(self.path)
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                raise

    def remove_stale_temp_files(self) -> List[str]:
        """Remove the temp files of whole writes that a killed run never finished: the
        `.native-state.json.tmp-XXXX` of write_atomically, and `native-state.json.tmp.PID` of older
        versions. Only one run uses a state directory at a time, so none of them is being written.
        Returns the names removed."""
        return remove_unfinished_writes(self.path, older_prefixes=(f"{os.path.basename(self.path)}.tmp.",))

    # ---- reading ------------------------------------------------------------------------------

    def load(self) -> Optional[Tuple[List[Tuple[str, dict]], Sections]]:
        """What an earlier run's file holds: ([(where, thread record JSON)], sections), where
        `where` names the entry for messages; None when there is no file. StateFileError names
        the file and why none of it can be used; the lines skipped are in `skipped`."""
        self.skipped = []
        if not os.path.lexists(self.path):
            return None
        try:
            # No size bound on the open: a journal is read line by line (a line too long costs
            # itself); only a file of version 1, one document, is bounded as a whole.
            fd = open_checked(self.path, require_trusted=True, limit=None, follow_symlinks=False, owner=os.geteuid())
        except ConfigError as exc:
            raise StateFileError(f"{self.path}: {exc.problems[0].message}") from None
        with os.fdopen(fd, "rb") as handle:
            first = handle.readline(MAX_LINE_BYTES + 1)
            header = _parse(first)
            if isinstance(header, dict) and header.get("version") == STATE_VERSION:
                return self._replay(_journal_lines(handle))
            size = os.fstat(fd).st_size
            if size > MAX_FILE_BYTES:
                raise StateFileError(f"{self.path}: refused: {size} bytes without a version {STATE_VERSION} header, "
                                     f"expected at most {MAX_FILE_BYTES}")
            raw = first + handle.read(MAX_FILE_BYTES)
        try:
            whole = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            raise StateFileError(f"{self.path}: unreadable state file: {exc}") from None
        found = whole.get("version") if isinstance(whole, dict) else type(whole).__name__
        if found != 1:
            raise StateFileError(f"{self.path}: version: expected one of {READ_VERSIONS}, found {found!r}")
        threads = whole.get("threads", [])
        if not isinstance(threads, list):
            raise StateFileError(f"{self.path}: threads: expected a list")
        sections = {name: value for name, value in whole.items()
                    if name not in ("version", "writer_pid", "written_at", "threads")}
        return [(f"threads[{index}]", item) for index, item in enumerate(threads)], sections

    def _replay(self, lines: Iterable[Optional[bytes]]) -> Tuple[List[Tuple[str, dict]], Sections]:
        threads: Dict[ThreadKey, Tuple[str, dict]] = {}
        sections: Sections = {}
        for number, line in enumerate(lines, start=2):
            where = f"line {number}"
            if line is _REST:  # the last item
                self.skipped.append(f"line {number} and after (past {MAX_READ_BYTES} bytes)")
                break
            try:
                if line is None:
                    raise ValueError("too long")
                entry = json.loads(line)
                if "thread" in entry:
                    record = entry["thread"]
                    threads[(int(record["tid"]), int(record["start_time"]))] = (where, record)
                elif "gone" in entry:
                    tid, start_time = entry["gone"]
                    threads.pop((int(tid), int(start_time)), None)
                elif "section" in entry:
                    _apply_section_line(sections, entry)
                else:
                    raise ValueError("expected thread, gone or section")
            except (KeyError, TypeError, ValueError, AttributeError, RecursionError):
                self.skipped.append(where)  # this entry is lost; the others still count
        return list(threads.values()), sections


def _journal_lines(handle: BinaryIO) -> Iterator[Optional[bytes]]:
    """Each complete line of the journal after its header, without its newline; None for a line
    over MAX_LINE_BYTES, read through in pieces and never held whole. What follows the last
    newline (empty, or a line a kill cut short) is not a line. _REST once past MAX_READ_BYTES."""
    while True:
        if handle.tell() > MAX_READ_BYTES:
            yield _REST
            return
        line = handle.readline(MAX_LINE_BYTES + 1)
        if line.endswith(b"\n"):
            yield line[:-1]
            continue
        if len(line) <= MAX_LINE_BYTES:
            return  # the end of the file: nothing, or a last line cut short
        while not line.endswith(b"\n") and handle.tell() <= MAX_READ_BYTES:
            line = handle.readline(MAX_LINE_BYTES)
            if not line:
                return  # a last line cut short, whatever its length
        if not line.endswith(b"\n"):
            yield _REST  # left unfinished at the read bound
            return
        yield None


def _updated(threads: Dict[ThreadKey, _Written], updates: Mapping[ThreadKey, Optional[_Written]]) -> Dict[ThreadKey, _Written]:
    """`threads` with these entries set (None: removed), changed in place."""
    for key, written in updates.items():
        if written is None:
            threads.pop(key, None)
        else:
            threads[key] = written
    return threads


def _parse(line: bytes) -> Any:
    try:
        return json.loads(line)
    except (ValueError, RecursionError):
        return None


def _section_lines(before: Sections, now: Sections) -> List[str]:
    """The lines that turn `before` into `now`: per section, the entries set and dropped."""
    lines = []
    for kind in sorted(set(before) | set(now)):
        old, new = before.get(kind, {}), now.get(kind, {})
        if old == new:
            continue
        changed: Dict[str, Dict[str, Any]] = {}
        dropped: Dict[str, List[str]] = {}
        for part in set(old) | set(new):
            was, is_now = old.get(part, {}), new.get(part, {})
            if was == is_now:
                continue
            values = {key: value for key, value in is_now.items() if key not in was or was[key] != value}
            gone = [key for key in was if key not in is_now]
            if values:
                changed[part] = values
            if gone:
                dropped[part] = gone
        lines.append(_line({"section": kind, "set": changed, "drop": dropped}))
    return lines


def _apply_section_line(sections: Sections, entry: Mapping[str, Any]) -> None:
    """One section line replayed; ValueError (before any of it counts) where it is not as written."""
    changed, dropped = entry.get("set") or {}, entry.get("drop") or {}
    if not (isinstance(changed, dict) and all(isinstance(values, dict) for values in changed.values())
            and isinstance(dropped, dict) and all(isinstance(keys, list) for keys in dropped.values())):
        raise ValueError("expected set: {part: {key: value}} and drop: {part: [key]}")
    section = sections.setdefault(str(entry["section"]), {})
    for part, values in changed.items():
        section.setdefault(part, {}).update(values)
    for part, keys in dropped.items():
        table = section.get(part, {})
        for key in keys:
            table.pop(str(key), None)
