"""What the inventory reports: after each batch of events or scan, the changes it made to the
store (one kind per way a process or thread can come, go or change) and a scan's summary. Its
counters are the typed status's InventoryView (control/status.py)."""

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


@dataclass(frozen=True)
class Change:
    kind: str  # one of the kinds above
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
