"""What temperd says of itself, typed: one `Status`, built once per request by the daemon
(daemon/status_report.py), sent over the control socket as JSON (`temperctl status --json`
prints it, the text is rendered from it), its backend and layers part of /observe, and read by
the metrics (observe/status_metrics.py) where a metric is the same fact. A field added here
appears in all of them. Plain data, written and read by typed_json."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from temperd.control.typed_json import FLATTEN, from_json, to_json


@dataclass(frozen=True)
class ReloadView:
    """The last reload: adopted or refused, and why."""
    ok: bool  # adopted; False: refused, the running configuration stays
    generation: int  # in force afterwards
    at: float
    trigger: str  # "start", "SIGHUP", "file change", "CPU hotplug", "temperctl reload"
    problems: List[str]
    summary: str


@dataclass(frozen=True)
class ExitView:
    code: int  # negative: killed by that signal
    requested: bool  # temperd asked it to stop
    reason: str
    wall_time: float


@dataclass(frozen=True)
class GapView:
    """Time on the kernel's default scheduler between scx_layered runs."""
    last: Optional[float]
    total: float


@dataclass(frozen=True)
class SupervisorView:
    """scx_layered's process, as its supervisor (backends/scx/lifecycle.py) reports it."""
    state: str
    pid: Optional[int]
    binary: str
    args: List[str]
    config_path: str
    log_path: str
    stats_socket: str
    uptime_s: Optional[float]
    pending_change: bool
    next_restart_in_s: Optional[float]
    safe_mode: bool
    safe_mode_reason: Optional[str]
    crashes_in_window: int
    last_exit: Optional[ExitView]
    default_scheduler_gap_s: GapView
    stats_age_s: Optional[float]
    stats_error: Optional[str]
    starts: int  # the counts are since the supervisor was made
    restarts: int  # for plan changes
    crash_restarts: int
    crashes: int
    outside_stops: int
    coalesced_changes: int
    refusals: int
    stats_reads: int
    stats_errors: int
    safe_mode_entries: int


@dataclass(frozen=True)
class ScxStatsView:
    """scx_layered's latest stats, numbers only: host-wide, and per layer (with the CPUs it holds)."""
    system: Dict[str, float]
    layers: Dict[str, Dict[str, Any]]


@dataclass(frozen=True)
class ScxView:
    """The scx backend's own state (written into the backend's object)."""
    fallback_reason: Optional[str]  # why the native backend carries the plan; None while scx_layered does
    safe_mode: bool
    safe_mode_reason: Optional[str]
    render_notes: List[str]
    render_problems: List[str]
    scx_layered: SupervisorView
    scx_stats: ScxStatsView


@dataclass(frozen=True)
class BackendView:
    requested: str  # what temperd.toml asks for
    active: str  # the backend chosen: scx or native
    reason: str
    carried_by: str  # who carries the plan now
    drift: Dict[str, int] = field(default_factory=dict)  # settings someone else changed, by kind, since start
    scx: Optional[ScxView] = field(default=None, metadata=FLATTEN)

    @property
    def safe_mode(self) -> bool:
        """scx_layered given up on (a crash loop or a refusal): the native backend carries the plan."""
        return self.scx is not None and self.scx.safe_mode


@dataclass(frozen=True)
class ProblemView:
    file: str
    line: Optional[int]
    key: str
    message: str


@dataclass(frozen=True)
class ProfilesView:
    loaded: List[str]
    failed: List[ProblemView]
    disabled_patterns: Dict[str, str]  # regular expression -> why it is off


@dataclass(frozen=True)
class WorkloadView:
    key: str
    profile: Optional[str]
    tier: str
    budget: Optional[float]
    source: str
    reason: str
    pids: List[int]
    threads: int
    groups: Dict[str, int]  # thread group -> threads


@dataclass(frozen=True)
class LayerScxView:
    """What scx_layered reports of a layer."""
    util_pct: Optional[float]
    tasks: Optional[float]
    cpus_held: Optional[float]
    cpus: List[int]
    text: str


@dataclass(frozen=True)
class LayerView:
    name: str
    kind: str
    treatment: str
    ownership: Optional[str]
    cpus: List[int]
    members: Optional[int]
    plan: bool  # False: scx_layered's own layer beyond the plan (the catch-all)
    scx: Optional[LayerScxView]  # while scx_layered carries the plan


@dataclass(frozen=True)
class ApplyView:
    """The backend's last apply (backends/result.py's ApplyResult)."""
    applied: Dict[str, int]
    failed: Dict[str, int]
    restored: Dict[str, int]
    drift: Dict[str, int]
    unmovable: int
    gone: int
    threads_treated: int
    errors: List[str]
    notes: List[str]
    unsupported: List[str]


@dataclass(frozen=True)
class LintView:
    total: int
    by_invariant: Dict[str, int]  # only the invariants violated


@dataclass(frozen=True)
class OverheadView:
    """The last observation sample's cost, as the observer (observe/observer.py) measures it."""
    sample_cpu_s: float  # CPU time the sample took
    observe_cpu_ratio: float  # observation CPU / wall since the previous sample
    daemon_cpu_ratio: float  # the whole temperd process, share of one core
    window_s: float


@dataclass(frozen=True)
class InventoryView:
    """Process events and /proc scans, as the inventory (sources/inventory.py) counts them."""
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


@dataclass(frozen=True)
class EventPathView:
    """The passes that handled process events since start (read the new processes and threads,
    matched, planned and applied what changed) and the main loop's CPU time in them: what the
    host's churn costs temperd. The idle cgroup's moves, made on a worker thread, are not in it."""
    passes: int
    cpu_s: float


@dataclass(frozen=True)
class LearnerView:
    """The learner's own cost and state."""
    workloads: int
    samples: int
    sample_cpu_s_total: float
    last_sample_cpu_s: float
    history_file: str
    history_bytes: int
    history: Optional[str]


@dataclass(frozen=True)
class Status:
    """`temperctl status`: the daemon, its configuration, backend, workloads, layers and cost."""
    version: str
    state: str  # starting, running, stopping
    pid: int
    uptime_s: float
    config_dir: str
    generation: int
    last_reload: Optional[ReloadView]
    backend: BackendView
    machine_shape: str
    profiles: ProfilesView
    workloads: List[WorkloadView]
    layers: List[LayerView]
    last_apply: Optional[ApplyView]
    lint: LintView
    telemetry: str
    overhead: Optional[OverheadView]
    inventory: InventoryView
    candidates: str  # what a new program is checked by
    replans: int
    learner: Optional[LearnerView]  # classification, rightsizing
    http: Optional[str]  # where it really listens
    event_path: Optional[EventPathView] = None  # None from a temperd that did not count it

    def to_json(self) -> Dict[str, Any]:
        return to_json(self)

    @classmethod
    def from_json(cls, data: Any) -> "Status":
        return from_json(cls, data)
