"""A batch's moves into a cgroup v1 hierarchy, made on a thread of their own.

A write to a v1 `tasks` file takes the cgroup threadgroup lock for writing, and the first such
write after a quiet spell waits for an RCU grace period: measured on a 6.18 kernel with 2 CPUs,
6-14 ms for the first move, 0.02-0.05 ms for each one after it. Under a fork storm the idle
cgroup takes a batch of yield threads every few tens of milliseconds, so each batch paid that
wait on the main loop, and the next batch of events waited behind it. Here the moves are handed
to one worker thread, and the main loop goes on; the next call that reads or writes the cgroup
waits for them first (wait()), so nothing is read while a move is on its way.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, List, Optional, Sequence, Tuple, TypeVar

K = TypeVar("K")
V = TypeVar("V")
Move = Tuple[K, V, Optional[V]]  # (thread key, the cgroup it goes to, the one temperd wrote before)


class DeferredMoves(Generic[K, V]):
    """Moves of threads, by tid, through an open `tasks` file, made by a worker thread."""

    def __init__(self):
        self._pool: Optional[ThreadPoolExecutor] = None
        self._pending: Optional[Future] = None
        self._lock = threading.Lock()

    def submit(self, tasks_fd: int, moves: Sequence[Move]) -> None:
        """Move each thread of `moves` by writing its tid to `tasks_fd`, which the worker closes.
        The moves of an earlier submit are made first."""
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="temperd-cgroup-moves")
            earlier = self._pending
            self._pending = self._pool.submit(self._move, tasks_fd, list(moves), earlier)

    def wait(self) -> Tuple[int, List[Tuple[K, V, Optional[V], OSError]]]:
        """Wait for every move submitted: (how many were made, each failed one with its error)."""
        with self._lock:
            pending, self._pending = self._pending, None
        if pending is None:
            return 0, []
        return pending.result()

    def close(self) -> None:
        """Wait for the moves, and end the worker (it is made again by the next submit)."""
        self.wait()
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)

    def _move(self, tasks_fd: int, moves: List[Move], earlier: Optional[Future]):
        made, failed = 0, []
        try:
            if earlier is not None:  # not waited for by anyone: its outcome is carried into this one
                made, failed = earlier.result()
            for key, value, previous in moves:
                try:
                    os.write(tasks_fd, str(key[0]).encode())  # key: (tid, start time)
                    made += 1
                except OSError as exc:
                    failed.append((key, value, previous, exc))
        finally:
            os.close(tasks_fd)
        return made, failed
