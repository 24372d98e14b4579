"""What the control commands and the status report read and call of the running daemon, typed as a
protocol: they take a DaemonState, never the `Daemon` class, so that daemon.py imports them and
none of them imports daemon.py (the main loop has its own, main_loop.LoopHost)."""

from __future__ import annotations

import threading
from typing import Any, Dict, Optional, Protocol

from temperd.backends.select import BackendChoice
from temperd.backends.status import BackendStatus
from temperd.control.status import ReloadView, Status
from temperd.daemon.services import Services
from temperd.decide.hostview import HostView
from temperd.decide.matcher import Matcher, MatchResult, RuntimeBinding
from temperd.observe.sampler import Sampler
from temperd.observe.learner import WorkloadLearner
from temperd.plan import LayerPlan
from temperd.sources.inventory import Inventory


class DaemonState(Protocol):
    """The running state, read under `lock` (status, explain, plan, bind, classify, rightsize)."""

    lock: threading.RLock
    state: str  # starting, running, stopping
    started_at: float
    config_dir: str
    generation: int
    view: Optional[HostView]
    inventory: Inventory
    matcher: Optional[Matcher]
    match: MatchResult
    plan: Optional[LayerPlan]
    runtime_bindings: Dict[int, RuntimeBinding]
    last_reload: Optional[ReloadView]
    last_apply: Optional[Any]
    replans: int
    event_passes: int  # passes that handled process events (main_loop.py), and their CPU time
    event_cpu_s: float
    backend_choice: Optional[BackendChoice]
    sampler: Optional[Sampler]
    services: Services
    learner: Optional[WorkloadLearner]  # classification and rightsizing

    def status(self) -> Optional[Status]:
        ...

    def reload(self, trigger: str) -> ReloadView:
        ...

    def set_runtime_bindings(self, bindings: Dict[int, RuntimeBinding], trigger: str) -> None:
        ...

    def backend_status(self) -> BackendStatus:
        ...
