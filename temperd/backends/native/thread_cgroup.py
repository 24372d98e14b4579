"""A thread's cgroup in the cgroup v1 cpu hierarchy, as a held setting (held.py) of the idle cgroup."""

from __future__ import annotations

import contextlib
import os
from typing import Container, Dict, Iterator, Optional

from temperd.backends.native.held import Setting
from temperd.backends.native.membership import ThreadKey
from temperd.sources import procfs

IDLE_CGROUP = "idle_cgroup"
ROOT = "/"


class ThreadCpuCgroup(Setting[ThreadKey, str]):
    """A thread's cgroup in the v1 cpu hierarchy, as a path from the hierarchy's root."""

    kind = IDLE_CGROUP

    def __init__(self, mount: str):
        self.mount = mount
        self.fresh: Container[ThreadKey] = ()  # see batch()
        self._tasks: Dict[str, int] = {}  # cgroup path -> its open tasks file, within batch()

    def read(self, key: ThreadKey) -> Optional[str]:
        """None when the thread is gone (or its tid now names another thread). A thread of
        `fresh` is not checked for its start time: the inventory read it within this pass."""
        tid, start_time = key
        if key not in self.fresh:
            stat = procfs.read_task_stat(tid, tid)  # /proc/TID/task/TID reaches any thread
            if stat is None or stat.start_time != start_time:
                return None
        paths = procfs.read_cgroup(tid, tid)
        return paths.cpu_v1 if paths is not None else None

    def write(self, key: ThreadKey, path: str) -> None:
        fd = self._tasks.get(path)
        if fd is None:
            move(self.mount, path, key[0])
        else:
            os.write(fd, str(key[0]).encode())

    @contextlib.contextmanager
    def batch(self, fresh: Container[ThreadKey]) -> Iterator[None]:
        """Within: the `fresh` threads' start times are taken as read, and moves share one open
        tasks file per cgroup (an open and close cost as much as the move itself)."""
        self.fresh = fresh
        try:
            yield
        finally:
            self.fresh = ()
            for fd in self._tasks.values():
                os.close(fd)
            self._tasks.clear()

    def take_tasks(self, path: str) -> Optional[int]:
        """The open tasks file of the cgroup at `path`, no longer closed when the batch ends."""
        return self._tasks.pop(path, None)

    def open_tasks(self, path: str) -> bool:
        """Keep the tasks file of the cgroup at `path` open until the batch ends (where it cannot
        be opened, each move opens it and says why it failed); whether it is open."""
        if path not in self._tasks:
            try:
                self._tasks[path] = os.open(os.path.join(self.mount, path.lstrip("/"), "tasks"),
                                            os.O_WRONLY | os.O_CLOEXEC)
            except OSError:
                return False
        return True

    def where(self, key: ThreadKey) -> str:
        return f"tid {key[0]}"

    def shown(self, path: str) -> str:
        return f"cpu cgroup {path}"

    def key_from_text(self, text: str) -> ThreadKey:
        """TID/START, as earlier releases wrote the idle cgroup's section (IdleCgroup writes none now)."""
        tid, _, start = text.partition("/")
        return int(tid), int(start)


def move(mount: str, path: str, tid: int) -> None:
    """Put one thread in the cgroup at `path` of the v1 hierarchy mounted at `mount`."""
    with open(os.path.join(mount, path.lstrip("/"), "tasks"), "w") as handle:
        handle.write(str(tid))
