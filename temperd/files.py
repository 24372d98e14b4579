"""File primitives every stage shares: read a kernel file that may vanish, write a file atomically."""

from __future__ import annotations

import errno
import os
import tempfile
from typing import List, Optional, Sequence, TypeVar, Union

Text = TypeVar("Text", str, bytes)

# The process's or the host's file table is full: every open, read of /proc and accept needs a
# descriptor, so what fails with these passes once some are freed.
OUT_OF_DESCRIPTORS = (errno.EMFILE, errno.ENFILE)


def read_stripped(path: str) -> Optional[str]:
    """The file's text without surrounding white space, or None when it cannot be read (gone,
    not permitted, not there on this kernel): the caller decides what absence means. newline="":
    universal newlines would turn a \\r inside a line into the end of one (kernel_lines)."""
    try:
        with open(path, newline="") as handle:
            return handle.read().strip()
    except OSError:
        return None


def kernel_lines(data: Text) -> List[Text]:
    """The lines of a line-oriented kernel file (/proc, sysfs, cgroupfs, tracefs), split on "\\n"
    alone; no empty last line for the final newline. splitlines() also breaks on \\r, \\v, \\f,
    \\x1c-\\x1e, U+0085, U+2028 and U+2029 (bytes: on \\r), which the kernel lets a name in the
    file hold (a cgroup, a mount point): such a name would end its line and forge the next one."""
    lines = data.split("\n" if isinstance(data, str) else b"\n")
    if not lines[-1]:
        lines.pop()
    return lines


def write_atomically(path: str, data: Union[str, bytes], mode: int = 0o644, durable: bool = True) -> None:
    """Replace path with data so that a reader (or a restart after a crash) sees the old file or
    the new one, never a part: temp file in the same directory, fsync, rename. durable False: no
    fsync, for state that ends with the boot (a killed writer's data is in the page cache)."""
    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.tmp-", dir=directory)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data.encode() if isinstance(data, str) else data)
            handle.flush()
            if durable:
                os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def remove_unfinished_writes(path: str, older_prefixes: Sequence[str] = ()) -> List[str]:
    """Remove the temp files (`.NAME.tmp-XXXX`) that write_atomically leaves when its writer is
    killed, and names starting with `older_prefixes`; only one writer uses each file, so none of
    them is being written now. Returns the names removed."""
    directory = os.path.dirname(path) or "."
    name = os.path.basename(path)
    prefixes = (f".{name}.tmp-", *older_prefixes)
    try:
        entries = os.listdir(directory)
    except OSError:
        return []
    removed = []
    for entry in sorted(entries):
        if not entry.startswith(prefixes):
            continue
        try:
            os.unlink(os.path.join(directory, entry))
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                continue
        removed.append(entry)
    return removed
