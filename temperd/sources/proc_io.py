"""Per-process storage I/O from /proc/PID/io: bytes the process caused to be read from or written
to storage (page cache hits and swap are not counted), for the whole thread group."""

from __future__ import annotations

from typing import NamedTuple, Optional

from temperd.files import kernel_lines
from temperd.sources import procfs


class ProcessIo(NamedTuple):
    read_bytes: int
    write_bytes: int
    cancelled_write_bytes: int

    @property
    def storage_bytes(self) -> int:
        return self.read_bytes + max(0, self.write_bytes - self.cancelled_write_bytes)


def parse_io(data: bytes) -> Optional[ProcessIo]:
    values = {}
    for line in kernel_lines(data):
        key, _, value = line.partition(b":")
        if value:
            try:
                values[key.strip()] = int(value)
            except ValueError:
                return None
    try:
        return ProcessIo(values[b"read_bytes"], values[b"write_bytes"], values[b"cancelled_write_bytes"])
    except KeyError:
        return None


def read_process_io(pid: int) -> Optional[ProcessIo]:
    """None where the process is gone or its io file is not readable (another user's, no privilege)."""
    data = procfs.read_bytes(f"{procfs.PROC}/{pid}/io", 1024)
    return parse_io(data) if data else None
