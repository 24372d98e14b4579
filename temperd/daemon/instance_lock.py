"""One temperd per state directory: an exclusive lock on its `temperd.lock`, which holds the pid."""

from __future__ import annotations

import fcntl
import os
from typing import Optional

LOCK_FILE = "temperd.lock"


class AlreadyRunning(Exception):
    """Another process holds the lock; the message names the file."""


class InstanceLock:
    def __init__(self, state_dir: str):
        self.path = os.path.join(state_dir, LOCK_FILE)
        self._fd: Optional[int] = None

    def acquire(self) -> None:
        """Take the lock (held until release() or the process ends) and write our pid into it."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise AlreadyRunning(f"another temperd is running (lock {self.path} is held)") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
