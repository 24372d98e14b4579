"""What temperd shows of itself: `temperctl status` (JSON), the one-line status (systemd's STATUS
and the log) and /observe. Called under the daemon's lock; nothing here changes its state."""

from __future__ import annotations

import dataclasses
import os
import time
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from temperd import __version__
from temperd.config import safe_regex

if TYPE_CHECKING:
    from temperd.daemon.state import DaemonState


def status_json(daemon: "DaemonState") -> Dict[str, Any]:
    view, sampler, http = daemon.view, daemon.sampler, daemon.services.http
    assert view is not None and sampler is not None, "temperd has started"
    pset = view.profiles
    return {
        "version": __version__,
        "state": daemon.state,
        "pid": os.getpid(),
        "uptime_s": round(time.time() - daemon.started_at, 1),
        "config_dir": daemon.config_dir,
        "generation": daemon.generation,
        "last_reload": daemon.last_reload.as_dict() if daemon.last_reload else None,
        "backend": backend_json(daemon),
        "machine_shape": view.shape.describe(),
        "profiles": {"loaded": sorted(pset.active), "failed": [p.as_dict() for p in pset.problems],
                     "disabled_patterns": safe_regex.disabled_patterns()},
        "workloads": [workload_summary(w) for w in daemon.match.workloads],
        "layers": layer_rows(daemon),
        "last_apply": _as_dict(daemon.last_apply),
        "lint": sampler.lint.summary(),
        "telemetry": sampler.telemetry.describe(),
        "overhead": dataclasses.asdict(sampler.observation.overhead) if sampler.observation is not None else None,
        "inventory": dataclasses.asdict(daemon.inventory.stats),
        "candidates": daemon.inventory.gate.describe,  # what a new program is checked by
        "replans": daemon.replans,
        "watch": daemon.watch.describe() if daemon.watch is not None else None,  # classification, rightsizing
        "http": f"http://{http.address}" if http else None,  # where it really listens
    }


def observe_json(daemon: "DaemonState") -> Dict[str, Any]:
    """The latest observation sample, its lint violations and the backend."""
    sampler = daemon.sampler
    assert sampler is not None, "temperd has started"
    data = sampler.observation.to_json() if sampler.observation is not None else {}
    data["lint"] = [dataclasses.asdict(v) for v in sampler.lint.violations]
    data["backend"] = backend_json(daemon) if daemon.backend_choice else None
    # What scx_layered reports of each layer, beside what temperd observed of it; its layers
    # beyond the plan (the catch-all) apart, as the observed ones have fields those lack.
    rows = {row["name"]: row for row in layer_rows(daemon)}
    for layer in data.get("layers") or []:
        layer["scx"] = rows.pop(layer["name"], {}).get("scx")
    data["scx_layers_beyond_plan"] = [{"name": row["name"], "scx": row["scx"]} for row in rows.values()
                                      if not row["plan"]]
    watch = daemon.watch
    if watch is not None:  # what temperd learned of each workload ([classify], [rightsizing])
        data["classification"] = [c.as_json() for c in watch.classifications()] if watch.settings.classify else None
        data["rightsizing"] = [r.as_json() for r in watch.recommendations()] if watch.settings.rightsizing else None
    return data


def layer_rows(daemon: "DaemonState") -> List[Dict[str, Any]]:
    """The plan's layers, each with what scx_layered reports of it (`scx`: its CPU use, the CPUs
    it holds) while scx_layered carries the plan; then the layers scx_layered has beyond the plan
    (the catch-all for every other task), marked `plan: false`."""
    scx = daemon.backend_status().scx
    carried = scx if scx is not None and scx.fallback_reason is None else None
    rows = [{"name": l.name, "kind": l.kind, "treatment": l.treatment, "ownership": l.holds_cpus, "cpus": list(l.cpus),
             "members": len(l.selector.tids), "plan": True, "scx": carried.layer_view(l.name) if carried else None}
            for l in (daemon.plan.layers if daemon.plan else ())]
    planned = {row["name"] for row in rows}
    if carried is not None:
        rows.extend({"name": name, "kind": "Open", "treatment": "catch-all", "ownership": None, "cpus": [], "members": None,
                     "plan": False, "scx": carried.layer_view(name)}
                    for name in sorted(carried.layer_stats) if name not in planned)
    return rows


def backend_json(daemon: "DaemonState") -> Dict[str, Any]:
    """The backend choice (requested, active, reason) and the backend's own status."""
    return {**dataclasses.asdict(daemon.backend_choice), **daemon.backend_status().as_dict()}


def status_line(daemon: "DaemonState") -> str:
    workloads = len(daemon.match.workloads)
    layers = len(daemon.plan.layers) if daemon.plan else 0
    violations = len(daemon.sampler.lint.violations) if daemon.sampler is not None else 0
    return (f"{daemon.state}; backend {daemon.carried_by()}; "
            f"generation {daemon.generation}; {workloads} workloads, {layers} layers; "
            f"{violations} lint violations")


def workload_summary(workload) -> Dict[str, Any]:
    groups: Dict[str, int] = {}
    for thread in workload.threads:
        groups[thread.group or "-"] = groups.get(thread.group or "-", 0) + 1
    return {"key": workload.key, "profile": workload.profile_id, "tier": workload.tier, "budget": workload.budget,
            "source": workload.source, "reason": workload.reason, "pids": list(workload.pids),
            "threads": len(workload.threads), "groups": groups}


def _as_dict(value) -> Optional[dict]:
    if value is None:
        return None
    if dataclasses.is_dataclass(value):
        return dataclasses.asdict(value)
    return dict(value) if isinstance(value, dict) else {"value": str(value)}
