"""What temperd shows of itself: the typed Status (control/status.py) that `temperctl status`,
/observe and the metrics read, the one-line status (systemd's STATUS and the log) and /observe.
Nothing here changes the daemon's state."""

from __future__ import annotations

import dataclasses
import os
import time
from collections import Counter
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from temperd import __version__
from temperd.config import safe_regex
from temperd.control.status import (ApplyView, BackendView, EventPathView, LayerView, ProblemView,
                                    ProfilesView, Status, WorkloadView)
from temperd.control.typed_json import to_json

if TYPE_CHECKING:
    from temperd.backends.status import BackendStatus
    from temperd.daemon.state import DaemonState


def build_status(daemon: "DaemonState") -> Optional[Status]:
    """The Status, read under the daemon's lock; None until temperd has started."""
    with daemon.lock:
        view, sampler, http = daemon.view, daemon.sampler, daemon.services.http
        if view is None or sampler is None or daemon.backend_choice is None:
            return None
        backend = daemon.backend_status()  # read once: the scx backend's reads its supervisor
        pset = view.profiles
        observation = sampler.observation
        return Status(
            version=__version__, state=daemon.state, pid=os.getpid(),
            uptime_s=round(time.time() - daemon.started_at, 1), config_dir=daemon.config_dir,
            generation=daemon.generation,
            last_reload=daemon.last_reload,
            backend=backend_view(daemon, backend), machine_shape=view.shape.describe(),
            profiles=ProfilesView(loaded=sorted(pset.active),
                                  failed=[ProblemView(**p.as_dict()) for p in pset.problems],
                                  disabled_patterns=dict(safe_regex.disabled_patterns())),
            workloads=[workload_view(w) for w in daemon.match.workloads],
            layers=layer_views(daemon, backend),
            last_apply=ApplyView(**dataclasses.asdict(daemon.last_apply)) if daemon.last_apply is not None else None,
            lint=sampler.lint.summary(),
            telemetry=sampler.telemetry.describe(),
            overhead=observation.overhead if observation is not None else None,  # the observer measures an OverheadView
            inventory=daemon.inventory.stats,
            candidates=daemon.inventory.gate.describe,
            replans=daemon.replans,
            learner=daemon.learner.describe() if daemon.learner is not None else None,
            http=f"http://{http.address}" if http else None,  # where it really listens
            event_path=EventPathView(daemon.event_passes, round(daemon.event_cpu_s, 6)),
        )


def observe_json(daemon: "DaemonState") -> Dict[str, Any]:
    """The latest observation sample, its lint violations, and the backend and each layer's
    scx_layered view from the Status."""
    sampler = daemon.sampler
    assert sampler is not None, "temperd has started"
    status = build_status(daemon)
    data = sampler.observation.to_json() if sampler.observation is not None else {}
    data["lint"] = [dataclasses.asdict(v) for v in sampler.lint.violations]
    data["backend"] = to_json(status.backend) if status is not None else None
    # What scx_layered reports of each layer, beside what temperd observed of it; its layers
    # beyond the plan (the catch-all) apart, as the observed ones have fields those lack.
    rows = {row.name: row for row in (status.layers if status is not None else ())}
    for layer in data.get("layers") or []:
        row = rows.pop(layer["name"], None)
        layer["scx"] = to_json(row.scx) if row is not None else None
    data["scx_layers_beyond_plan"] = [{"name": row.name, "scx": to_json(row.scx)} for row in rows.values()
                                      if not row.plan]
    learner = daemon.learner
    if learner is not None:  # what temperd learned of each workload ([classify], [rightsizing])
        data["classification"] = [c.as_json() for c in learner.classifications()] if learner.settings.classify else None
        data["rightsizing"] = [r.as_json() for r in learner.recommendations()] if learner.settings.rightsizing else None
    return data


def layer_views(daemon: "DaemonState", backend: "BackendStatus") -> List[LayerView]:
    """The plan's layers, each with what scx_layered reports of it (`scx`: its CPU use, the CPUs
    it holds) while scx_layered carries the plan; then the layers scx_layered has beyond the plan
    (the catch-all for every other task), marked `plan: false`."""
    carried = backend.scx_layers if backend.scx is not None and backend.scx.fallback_reason is None else None

    rows = [LayerView(name=l.name, kind=l.kind, treatment=l.treatment, ownership=l.holds_cpus, cpus=list(l.cpus),
                      members=len(l.selector.tids), plan=True,
                      scx=carried.get(l.name) if carried is not None else None)
            for l in (daemon.plan.layers if daemon.plan else ())]
    planned = {row.name for row in rows}
    if carried is not None:
        rows.extend(LayerView(name=name, kind="Open", treatment="catch-all", ownership=None, cpus=[], members=None,
                              plan=False, scx=carried[name])
                    for name in sorted(carried) if name not in planned)
    return rows


def backend_view(daemon: "DaemonState", backend: "BackendStatus") -> BackendView:
    """The backend choice (requested, active, reason) and the backend's own status."""
    choice = daemon.backend_choice
    assert choice is not None
    return BackendView(requested=choice.requested, active=choice.active, reason=choice.reason,
                       carried_by=backend.carried_by, drift=dict(backend.drift),
                       scx=backend.scx)


def status_line(daemon: "DaemonState") -> str:
    workloads = len(daemon.match.workloads)
    layers = len(daemon.plan.layers) if daemon.plan else 0
    violations = len(daemon.sampler.lint.violations) if daemon.sampler is not None else 0
    return (f"{daemon.state}; backend {daemon.backend_status().carried_by}; "
            f"generation {daemon.generation}; {workloads} workloads, {layers} layers; "
            f"{violations} lint violations")


def workload_view(workload) -> WorkloadView:
    groups = dict(Counter(thread.group or "-" for thread in workload.threads))
    return WorkloadView(key=workload.key, profile=workload.profile_id, tier=workload.tier, budget=workload.budget,
                        source=workload.source, reason=workload.reason, pids=list(workload.pids),
                        threads=len(workload.threads), groups=groups)
