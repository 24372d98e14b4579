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
import queue
import threading
import weakref
from typing import Any, Generic, List, Optional, Sequence, Tuple, TypeVar

K = TypeVar("K")
V = TypeVar("V")
Move = Tuple[K, V, Optional[V]]  # (thread key, the cgroup it goes to, the one temperd wrote before)
Failed = Tuple[Any, Any, Any, OSError]  # a Move that was not made, with its error
Outcome = Tuple[int, List[Failed], Optional[BaseException]]  # a batch's: made, failed, what stopped it


class DeferredMoves(Generic[K, V]):
    """Moves of threads, by tid, through an open `tasks` file, made by a worker thread.

    The worker takes each batch from a queue and answers it on another, in order: a batch's
    hand-off is a lock and two queue operations (events come tens of batches a second)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._todo: "queue.SimpleQueue[Optional[Tuple[int, List[Move]]]]" = queue.SimpleQueue()
        self._done: "queue.SimpleQueue[Outcome]" = queue.SimpleQueue()
        self._worker: Optional[threading.Thread] = None
        self._unanswered = 0  # batches submitted whose outcome wait() has not taken
        # The worker holds the queues, not this object: one dropped without close() ends it too.
        weakref.finalize(self, self._todo.put, None)

    def submit(self, tasks_fd: int, moves: Sequence[Move]) -> None:
        """Move each thread of `moves` by writing its tid to `tasks_fd`, which the worker closes.
        The moves of an earlier submit are made first."""
        with self._lock:
            if self._worker is None:
                self._worker = self._start_worker()
            self._unanswered += 1
            self._todo.put((tasks_fd, list(moves)))

    def wait(self) -> Tuple[int, List[Failed]]:
        """Wait for every move submitted: (how many were made, each failed one with its error)."""
        made, failed, error = 0, [], None
        with self._lock:
            for _ in range(self._unanswered):
                done, not_done, exc = self._done.get()
                made += done
                failed.extend(not_done)
                error = error or exc
            self._unanswered = 0
        if error is not None:
            raise error
        return made, failed

    def close(self) -> None:
        """Wait for the moves, and end the worker (it is made again by the next submit)."""
        try:
            self.wait()
        finally:
            with self._lock:
                worker, self._worker = self._worker, None
                if worker is not None:
                    self._todo.put(None)
            if worker is not None:
                worker.join()

    def _start_worker(self) -> threading.Thread:
        worker = threading.Thread(target=_work, args=(self._todo, self._done), name="temperd-cgroup-moves",
                                  daemon=True)  # close() (restore_all) waits for it; an exit without one drops it
        worker.start()
        return worker


def _work(todo: "queue.SimpleQueue", done: "queue.SimpleQueue") -> None:
    """The worker: each batch's moves made and answered, until a None."""
    while True:
        batch = todo.get()
        if batch is None:
            return
        try:
            done.put(_move(*batch) + (None,))
        except BaseException as exc:  # told to wait(), which raises it
            done.put((0, [], exc))


def _move(tasks_fd: int, moves: List[Move]) -> Tuple[int, List[Failed]]:
    made, failed = 0, []
    try:
        for key, value, previous in moves:
            try:
                os.write(tasks_fd, str(key[0]).encode())  # key: (tid, start time)
                made += 1
            except OSError as exc:
                failed.append((key, value, previous, exc))
    finally:
        os.close(tasks_fd)
    return made, failed
