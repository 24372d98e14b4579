"""Backends that carry out a LayerPlan, all behind one interface (Backend)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, FrozenSet, Iterable, Optional

try:
    from typing import Protocol
except ImportError:  # pragma: no cover - Python < 3.8 is not supported anyway
    Protocol = object  # type: ignore

if TYPE_CHECKING:
    from temperd.plan import LayerPlan
    from temperd.backends.native.backend import ApplyResult


class Backend(Protocol):
    """What the daemon's main loop calls; every call comes from that one thread."""

    def recover(self) -> "ApplyResult":
        """At start: undo what a crashed earlier run left (its state file)."""

    def apply(self, plan: "LayerPlan", threads: Iterable) -> "ApplyResult":
        """Carry out a whole plan for these threads (the host's, from the inventory)."""

    def on_new_threads(self, threads: Iterable) -> "ApplyResult":
        """Threads that appeared under an unchanged plan."""

    def stop(self) -> "ApplyResult":
        """Put back everything this backend changed."""

    def status(self) -> Dict[str, Any]:
        """Plain data for `temperctl status` and /observe; `carried_by` names who runs the plan."""

    def layer_cpus(self) -> Optional[Dict[str, FrozenSet[int]]]:
        """The CPUs Confined layers really own, when not the plan's own numbers; else None."""

    def retry(self) -> bool:
        """After a reload: try again what was given up (scx safe mode). True when something was."""
