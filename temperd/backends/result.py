"""What a backend did: one call's counts and messages (ApplyResult), and the drift it has found
since it started (DriftRecord). A leaf: the Backend interface, both backends and the observers
read these types without importing one another."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Protocol, Sequence


class RestoreCounts(Protocol):
    """What a restore of thread settings did (restore_ledger.RestoreOutcome)."""

    restored: Mapping[str, int]
    failed: Mapping[str, int]
    drift: Mapping[str, int]
    gone: int
    errors: Sequence[str]


class HeldCounts(Protocol):
    """What one kind of held host setting did (held.HostSettingResult)."""

    applied: int
    restored: int
    failed: int
    drift: int
    errors: Sequence[str]
    notes: Sequence[str]
    unsupported: Sequence[str]


def _add(table: Dict[str, int], kind: str, n: int = 1) -> None:
    if n:
        table[kind] = table.get(kind, 0) + n


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
        _add(table, kind, n)

    def take(self, outcome: RestoreCounts) -> None:
        """Merge what a restore of thread settings did."""
        for kind, n in outcome.restored.items():
            self.bump(self.restored, kind, n)
        for kind, n in outcome.failed.items():
            self.bump(self.failed, kind, n)
        for kind, n in outcome.drift.items():
            self.bump(self.drift, kind, n)
        self.gone += outcome.gone
        self.errors.extend(outcome.errors)

    def take_counts(self, kind: str, part: HeldCounts) -> None:
        """Merge what a held host setting (PM QoS, cgroup weights, autogroups) did."""
        self.bump(self.applied, kind, part.applied)
        self.bump(self.restored, kind, part.restored)
        self.bump(self.failed, kind, part.failed)
        self.bump(self.drift, kind, part.drift)
        self.errors.extend(part.errors)
        self.notes.extend(part.notes)
        if part.unsupported:
            said = set(self.unsupported)  # a check per text, not a walk of the list (one per workload)
            for text in part.unsupported:
                if text not in said:
                    said.add(text)
                    self.unsupported.append(text)

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
        self.unsupported.extend(other.unsupported)

    @property
    def ok(self) -> bool:
        return not self.failed

    def summary(self) -> str:
        def fmt(table: Dict[str, int]) -> str:
            return ", ".join(f"{k} {v}" for k, v in sorted(table.items())) or "none"

        return (f"applied: {fmt(self.applied)}; restored: {fmt(self.restored)}; failed: {fmt(self.failed)}; "
                f"drift: {fmt(self.drift)}; unmovable {self.unmovable}; gone {self.gone}; "
                f"threads held {self.threads_treated}")


@dataclass
class DriftRecord:
    """Settings found changed by someone else since the backend started, by kind.

    The one count of drift: each setting is counted once, when first found, from the results
    of the backend's calls (the same counts that ApplyResult.drift reports per call)."""

    counts: Dict[str, int] = field(default_factory=dict)

    def add(self, found: Mapping[str, int]) -> None:
        for kind, n in found.items():
            _add(self.counts, kind, n)

    @property
    def total(self) -> int:
        return sum(self.counts.values())
