"""What the inventory reports: after each batch of events or scan, the changes it made to the
store (one kind per way a process or thread can come, go or change) and a scan's summary; and
its counters (InventoryStats)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

# Change kinds. "update": the command line (process title), cgroup or owner changed without an exec,
# found by a scan: servers rewrite their title, tools move processes between cgroups.
NEW_PROCESS = "new_process"
NEW_THREAD = "new_thread"
EXEC = "exec"
RENAME = "rename"
EXIT = "exit"
REUSED = "reused"
UPDATE = "update"
CHANGE_KINDS = (NEW_PROCESS, NEW_THREAD, EXEC, RENAME, EXIT, REUSED, UPDATE)


@dataclass(frozen=True)
class Change:
    kind: str  # one of CHANGE_KINDS
    pid: int
    tid: Optional[int] = None  # None: the change concerns the whole process
    comm: Optional[str] = None  # new_thread, rename: the thread's name
    old_comm: Optional[str] = None  # rename: the name before


@dataclass(frozen=True)
class ReconcileSummary:
    changes: Tuple[Change, ...]
    processes: int
    threads: int
    duration_s: float
    cpu_s: float

    def count(self, kind: str) -> int:
        return sum(1 for change in self.changes if change.kind == kind)

    def describe(self) -> str:
        counts = ", ".join(f"{k} {self.count(k)}" for k in CHANGE_KINDS if self.count(k))
        return (
            f"{self.processes} processes, {self.threads} threads; {counts or 'no changes'}; "
            f"{self.cpu_s * 1e3:.1f} ms CPU"
        )


@dataclass(frozen=True)
class InventoryStats:
    events_active: bool
    events_received: int
    events_lost: int  # receive-buffer overflows (ENOBUFS); each lost an unknown number of events
    vanished: int  # tasks gone between event or listing and read: normal, counted only
    reconciles: int
    last_reconcile_duration_s: float
    last_reconcile_cpu_s: float
    processes: int
    threads: int
    last_event_lag_s: float  # kernel timestamp of the last event to its handling
    max_event_lag_s: float
    untracked: int = 0  # processes no profile, binding or marker can match: known by their leader only
    untracked_seen: int = 0  # programs turned down since start (each look cost the reads the candidate index asks, no plan)
    bounded: int = 0  # an untrusted owner's processes and threads not read (sources/tracking.py's bounds)
    event_filter: str = ""  # which process events the kernel delivers (proc_connector)
