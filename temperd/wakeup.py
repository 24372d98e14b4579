"""A pipe that wakes a thread blocked in poll(): a server thread waits on its listener and on
this, so it sleeps until a client or stop() comes instead of waking on a timer to look."""

from __future__ import annotations

import os


class Wakeup:
    def __init__(self) -> None:
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)

    def fileno(self) -> int:
        """Readable once wake() was called, until drain()."""
        return self._read

    def write_end(self) -> int:
        """The end wake() writes to (non-blocking, as signal.set_wakeup_fd requires)."""
        return self._write

    def wake(self) -> None:
        try:
            os.write(self._write, b"x")
        except BlockingIOError:
            pass  # the pipe is full: it is readable anyway

    def drain(self) -> None:
        try:
            while os.read(self._read, 4096):
                pass
        except BlockingIOError:
            pass

    def close(self) -> None:
        for fd in (self._read, self._write):
            try:
                os.close(fd)
            except OSError:
                pass
