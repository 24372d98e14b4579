"""The inventory's scan of /proc: the store made equal to what /proc shows, and what changed.
Events keep the store current; a scan repairs what they missed (an overflow, a restart, a host
without the process connector) and finds what sends no event (a new title, a cgroup move, an
owner changed by setuid())."""

from __future__ import annotations

from typing import Dict, List, Optional

from temperd.sources import procfs
from temperd.sources.changes import EXEC, EXIT, NEW_PROCESS, NEW_THREAD, RENAME, REUSED, UPDATE, Change
from temperd.sources.process_store import ZOMBIE_STATES, ProcessRecord, ProcessStore, read_some_stats, thread_facts
from temperd.sources.tracking import LIGHT, Tracker


def scan(store: ProcessStore, tracker: Optional[Tracker] = None) -> List[Change]:
    """Scan /proc and make the store equal to it; the changes made. A tracked process is read
    whole (a bounded one's known threads and the room left), any other by its leader's stat and
    what the gate asks for, never its threads: a host's idle threads cost nothing unless a
    process of theirs could match."""
    tracker = tracker if tracker is not None else Tracker(store)
    changes: List[Change] = []
    seen = set()
    store.quotas.cache_clear()  # an operator may have set one since
    for pid in procfs.list_pids():
        old = store.procs.get(pid)
        if old is not None:
            room = tracker.thread_room(pid)
            stats = procfs.read_thread_stats(pid) if room is None else read_some_stats(pid, len(old.threads) + room)
            leader = stats.get(pid) if stats is not None else None
            if leader is None:
                continue
            if old.start_time == leader.start_time:
                if rescan_process(store, old, leader, stats, changes):  # type: ignore[arg-type]
                    seen.add(pid)
                continue
            store.remove_process(pid)  # its pid reused
            changes.append(Change(EXIT, pid))
        else:
            leader = procfs.read_task_stat(pid, pid)
            if leader is None:
                continue
        proc = tracker.read_new(pid, leader)
        if proc is None:
            continue
        seen.add(pid)
        if proc is LIGHT:
            continue
        store.install(proc)  # type: ignore[arg-type]
        changes.append(Change(REUSED if old is not None else NEW_PROCESS, pid))
    for pid in [pid for pid in store.procs if pid not in seen]:
        store.remove_process(pid)
        changes.append(Change(EXIT, pid))
    for pid in [pid for pid in store.light if pid not in seen]:
        store.drop_light(pid)
    return changes


def rescan_process(store: ProcessStore, proc: ProcessRecord, leader: procfs.TaskStat,
                   stats: Dict[int, procfs.TaskStat], changes: List[Change]) -> bool:
    """Bring a known process up to date; False if it turned out to be gone (or a zombie)."""
    pid = proc.pid
    dirty = False
    whole = None  # a process-level change that stands for its threads
    if proc.ppid != leader.ppid:
        proc.ppid = leader.ppid
        dirty = True
    if not proc.is_kernel_thread:
        via = None
        if leader.state in ZOMBIE_STATES:
            via = next((tid for tid, st in stats.items() if st.state not in ZOMBIE_STATES), None)
        # None or empty means unreadable right now (an exiting process): keep the old.
        exe = procfs.read_exe(pid, via) or proc.exe
        cmdline = procfs.read_cmdline(pid, via) or proc.cmdline
        cgroup = procfs.read_cgroup(pid)
        old_cgroup = (proc.cgroup, proc.cgroup_systemd)
        new_cgroup = old_cgroup if cgroup is None else (cgroup.unified, cgroup.systemd)
        # setuid() without an exec sends no event: the scan sees the new owner
        uid = procfs.read_uid(pid, via)
        uid = proc.uid if uid is None else uid
        changed = cmdline != proc.cmdline or new_cgroup != old_cgroup or uid != proc.uid
        if exe != proc.exe:
            whole = EXEC  # an exec whose event was lost
            proc.exec_seen()
        elif changed:
            changes.append(Change(UPDATE, pid))
        if whole is not None or changed:
            proc.exe = exe
            proc.cmdline = cmdline
            proc.uid = uid
            proc.set_cgroup(cgroup)
            dirty = True
    threads = proc.threads
    thread_changes: List[Change] = []
    live = set()
    for tid, stat in stats.items():
        if stat.state in ZOMBIE_STATES:
            continue
        affinity = procfs.read_affinity(tid, pid)
        if affinity is None:
            continue
        live.add(tid)
        old = threads.get(tid)
        if old is None:
            thread_changes.append(Change(NEW_THREAD, pid, tid, comm=stat.comm))
            runtime = None
        elif old.start_time != stat.start_time:
            thread_changes.append(Change(REUSED, pid, tid, comm=stat.comm))
            runtime = None
        else:
            if (old.comm == stat.comm and old.last_cpu == stat.last_cpu and old.nice == stat.nice
                    and old.policy == stat.policy and old.affinity == affinity):
                continue  # unchanged: keep the record (most threads, most scans)
            if old.comm != stat.comm:
                thread_changes.append(Change(RENAME, pid, tid, comm=stat.comm, old_comm=old.comm))
            runtime = old.runtime_ns
        store.put_thread(proc, thread_facts(pid, tid, stat, runtime, affinity))
        dirty = True
    if len(live) != len(threads):
        for tid in [tid for tid in threads if tid not in live]:
            store.drop_thread(proc, tid)
            thread_changes.append(Change(EXIT, pid, tid))
            dirty = True
    if not threads:
        return False
    if dirty:
        store.touch(proc)
    if whole is not None:
        changes.append(Change(whole, pid))
    else:
        changes.extend(thread_changes)
    return True
