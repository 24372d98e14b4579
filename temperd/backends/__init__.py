"""Backends that carry out a LayerPlan, all behind one interface (Backend).

Threads: the daemon calls a backend only while it holds its one lock, but not always from one
thread: from its main loop, from the control socket's thread (`temperctl reload` reloads,
replans and applies there; `temperctl status` reads status()) and from an HTTP thread
(/observe). A backend may run threads of its own (the scx supervisor does); those never call
into the daemon beyond asking its main loop for a replan.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Dict, FrozenSet, Iterable, Mapping, Optional, Protocol

from temperd.backends.result import ApplyResult
from temperd.backends.status import BackendStatus

if TYPE_CHECKING:
    from temperd.plan import LayerPlan


class Backend(Protocol):
    """What the daemon calls, one call at a time (under the daemon's lock)."""

    # Set by the daemon: called (from a backend's own thread) when who carries the plan may change
    # and a replan should switch over (scx: safe mode, a refusal, scx_layered attached or gone);
    # the native backend never calls it.
    on_carrier_change: Optional[Callable[[str], None]]

    def recover(self) -> ApplyResult:
        """At start: undo what a crashed earlier run left (its state file)."""

    def apply(self, plan: "LayerPlan", threads: Iterable, changed: Optional[Iterable] = None) -> ApplyResult:
        """Carry out a whole plan for these threads (the host's, from the inventory: a list, or
        tid -> thread). `changed`: the threads new since the last apply, where the caller knows
        them (process events); a backend may then treat only those and the threads whose layer
        changed, when nothing else in the plan did. None: every thread may have changed."""

    def on_new_threads(self, threads: Iterable) -> ApplyResult:
        """Threads that appeared under an unchanged plan."""

    def forget_threads(self, tids: Iterable[int], live: Optional[Mapping[int, Any]] = None) -> None:
        """Threads that ended (after the apply of their batch): no longer part of the host's picture.
        live: tid -> the thread alive now under that id (a reused id names a new thread)."""

    def stop(self) -> ApplyResult:
        """Put back everything this backend changed."""

    def status(self) -> BackendStatus:
        """Who carries the plan, the drift found so far, and the scx backend's own state."""

    def layer_cpus(self) -> Optional[Dict[str, FrozenSet[int]]]:
        """The CPUs Confined layers really own, when not the plan's own numbers; else None."""

    def retry(self) -> bool:
        """After a reload: try again what was given up (scx safe mode). True when something was."""
