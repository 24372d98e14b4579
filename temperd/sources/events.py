"""Process events applied to the inventory's store: a fork, exec, rename or exit made into the
store's change and the inventory's report of it. A process the tracker keeps light costs no
read of its threads and reports no change (sources/light.py, sources/tracking.py). An untracked
process that execs and ends within one batch, doing nothing else in it, is not read at all
(passing_execs): what its exec would show is gone by the batch's end."""

from __future__ import annotations

import dataclasses
from typing import Container, List, Optional, Sequence, Set

from temperd.sources import procfs
from temperd.sources.changes import EXEC, EXIT, NEW_PROCESS, NEW_THREAD, RENAME, REUSED, Change
from temperd.sources.process_store import ProcessRecord, ProcessStore, thread_facts
from temperd.sources.proc_connector import ProcEvent
from temperd.sources.title_rechecks import TitleRechecks
from temperd.sources.tracking import LIGHT, Tracker


class EventApplier:
    def __init__(self, store: ProcessStore, tracker: Tracker, rechecks: TitleRechecks):
        self._store = store
        self._tracker = tracker
        self._rechecks = rechecks
        self.vanished = 0  # tasks gone between an event and the read of /proc: normal, counted only

    def apply(self, event: ProcEvent, changes: List[Change]) -> None:
        """Apply one event to the store, appending what changed."""
        kind = event.kind
        if kind == "fork":
            if event.tid == event.pid and self._forked_light(event.pid, event.parent_pid):
                return
            self._on_task_appeared(event.pid, event.tid, changes)
            if event.tid == event.pid:
                self._rechecks.schedule(event.pid)
        elif kind == "exec":
            self._on_exec(event.pid, changes)
        elif kind == "comm":
            self._on_comm(event.pid, event.tid, event.comm or "", changes)
        elif kind == "exit":
            self._on_exit(event.pid, event.tid, changes)

    def _forked_light(self, pid: int, parent: int) -> bool:
        """A child of a light process is light too, made without a read (its exec is looked at)."""
        record = self._store.light.get(parent)
        if record is None or not self._tracker.selective or pid in self._store.procs:
            return False
        self._store.put_light(record.forked(pid))
        return True

    def _on_task_appeared(self, pid: int, tid: int, changes: List[Change]) -> None:
        proc = self._store.procs.get(pid)
        if proc is None or tid == pid:
            if proc is None and tid != pid and pid in self._store.light:
                return  # a thread of an untracked process: never read
            self._on_process_appeared(pid, changes)
            return
        old = proc.threads.get(tid)
        if old is None and self._tracker.thread_room(pid) == 0:
            return  # an untrusted owner's bound: not read
        stat = procfs.read_task_stat(pid, tid)
        if stat is None:
            self.vanished += 1
            return
        if old is not None and old.start_time == stat.start_time:
            return
        info = thread_facts(pid, tid, stat, None)
        if info is None:
            self.vanished += 1
            return
        self._store.put_thread(proc, info)
        self._store.touch(proc)
        changes.append(Change(REUSED if old is not None else NEW_THREAD, pid, tid, comm=info.comm))

    def _on_process_appeared(self, pid: int, changes: List[Change]) -> None:
        old = self._store.procs.get(pid)
        if old is not None:
            leader = procfs.read_task_stat(pid, pid)
            if leader is None:
                self.vanished += 1
                return
            if old.start_time == leader.start_time:
                return  # already known (a scan saw it first)
            self._on_exec(pid, changes, leader)  # its pid reused: read whole, its leader's stat not again
            return
        self._on_exec(pid, changes)  # read whole as at an exec: a new process

    def _on_exec(self, pid: int, changes: List[Change], leader: Optional[procfs.TaskStat] = None) -> None:
        old = self._store.procs.get(pid)
        if old is None:
            proc = self._tracker.read_new(pid)  # a light process's new program is looked at again
            if proc is LIGHT:
                return
        else:
            proc = self._store.read_process(pid, leader=leader)
        if proc is None:
            self.vanished += 1
            return
        assert isinstance(proc, ProcessRecord)
        if old is None:
            kind = NEW_PROCESS
        elif old.start_time != proc.start_time:
            kind = REUSED
        else:
            kind = EXEC
            proc.execs = old.execs + 1
        self._store.install(proc)
        changes.append(Change(kind, pid))

    def _on_comm(self, pid: int, tid: int, comm: str, changes: List[Change]) -> None:
        proc = self._store.procs.get(pid)
        light = self._store.light.get(pid) if proc is None else None
        if light is not None:
            if tid == pid and light.comm != comm:
                self._store.put_light(light.renamed(comm))
                if self._tracker.gate.wants_name(comm):  # renamed into a candidate: tracked from now
                    self._promote(pid, changes)
            return
        old = proc.threads.get(tid) if proc is not None else None
        if old is None:
            self._on_task_appeared(pid, tid, changes)
            return
        if old.comm == comm:
            return
        self._store.put_thread(proc, dataclasses.replace(old, comm=comm))
        self._store.touch(proc)
        changes.append(Change(RENAME, pid, tid, comm=comm, old_comm=old.comm))

    def _promote(self, pid: int, changes: List[Change]) -> None:
        proc = self._tracker.read_new(pid, wanted=True)
        if proc is None:
            self.vanished += 1
        elif proc is not LIGHT:  # LIGHT: an untrusted owner's bound
            self._store.install(proc)  # type: ignore[arg-type]
            changes.append(Change(NEW_PROCESS, pid))

    def _on_exit(self, pid: int, tid: int, changes: List[Change]) -> None:
        proc = self._store.procs.get(pid)
        if proc is None:
            if tid == pid:
                self._store.drop_light(pid)
            return
        if tid not in proc.threads:
            return
        self._store.drop_thread(proc, tid)
        if proc.threads:
            # Another thread lives on (a leader that called pthread_exit, or exit_group under way).
            self._store.touch(proc)
            changes.append(Change(EXIT, pid, tid))
        else:
            self._store.remove_process(pid)
            changes.append(Change(EXIT, pid))


def passing_execs(events: Sequence[ProcEvent], procs: Container[int], bound: Container[int]) -> Set[int]:
    """Untracked processes that exec and end within one batch and do nothing else in it (no
    thread, fork or rename; not named by a runtime binding): their exec is not looked at (no read),
    for whatever it would find is gone by the batch's end (an unmatched exec loop's processes)."""
    execs: Set[int] = set()
    ended: Set[int] = set()
    spoiled: Set[int] = set()
    for event in events:
        kind, pid = event.kind, event.pid
        if kind == "exec":
            if pid in execs or pid in ended:
                spoiled.add(pid)
            execs.add(pid)
        elif kind == "exit":
            if event.tid != pid or pid not in execs:
                spoiled.add(pid)
            else:
                ended.add(pid)
        elif kind == "fork":
            if event.tid != pid or pid in execs:
                spoiled.add(pid)
            spoiled.add(event.parent_pid)
        else:
            spoiled.add(pid)
    return {pid for pid in ended if pid not in spoiled and pid not in procs and pid not in bound}
