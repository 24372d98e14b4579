"""What a backend did: one call's counts and messages (ApplyResult). A leaf: the Backend
interface, both backends and the observers read this type without importing one another. Every
setting temperd holds or restores (a thread's, held.py's) says what it did as an ApplyResult,
counted under its kind; a call merges them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List


@dataclass
class ApplyResult:
    applied: Dict[str, int] = field(default_factory=dict)  # kind -> settings changed
    failed: Dict[str, int] = field(default_factory=dict)
    restored: Dict[str, int] = field(default_factory=dict)
    drift: Dict[str, int] = field(default_factory=dict)  # newly found changed by someone else
    unmovable: int = 0  # threads that should leave the exclusive CPUs but cannot
    gone: int = 0  # threads that exited while being treated (normal)
    threads_treated: int = 0  # threads with at least one setting held by temperd after this call
    errors: List[str] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)
    unsupported: List[str] = field(default_factory=list)

    def bump(self, table: Dict[str, int], kind: str, n: int = 1) -> None:
        if n:
            table[kind] = table.get(kind, 0) + n

    def merge(self, other: "ApplyResult") -> None:
        """Add another result's counts and messages to this one."""
        for mine, theirs in ((self.applied, other.applied), (self.failed, other.failed),
                             (self.restored, other.restored), (self.drift, other.drift)):
            for kind, n in theirs.items():
                self.bump(mine, kind, n)
        self.unmovable += other.unmovable
        self.gone += other.gone
        self.errors.extend(other.errors)
        self.notes.extend(other.notes)
        if other.unsupported:
            said = set(self.unsupported)  # a check per text, not a walk of the list (one per workload)
            for text in other.unsupported:
                if text not in said:
                    said.add(text)
                    self.unsupported.append(text)

    def summary(self) -> str:
        def fmt(table: Dict[str, int]) -> str:
            return ", ".join(f"{k} {v}" for k, v in sorted(table.items())) or "none"

        return (f"applied: {fmt(self.applied)}; restored: {fmt(self.restored)}; failed: {fmt(self.failed)}; "
                f"drift: {fmt(self.drift)}; unmovable {self.unmovable}; gone {self.gone}; "
                f"threads held {self.threads_treated}")
