"""Why a process or thread is treated as it is: the answer to `temperctl explain`, read from one
inventory, match and plan (the daemon's own, on its control socket)."""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Optional

from temperd.decide.matcher import Matcher, MatchResult
from temperd.plan import LayerPlan
from temperd.sources.inventory import Inventory


class NoSuchTask(LookupError):
    pass


def explain(task_id: int, inventory: Inventory, match: MatchResult, layer_plan: Optional[LayerPlan],
            matcher: Matcher) -> Dict[str, Any]:
    """{"pid", "tid" (None when task_id is a process), "process", "unit", "unit_cgroup" (the
    systemd path the unit is read from), "system_unit" (run by the system manager), "cgroup" (v2),
    "workload" (None: not treated), "why_not", "threads": the task's threads in its workload, each
    with its "layer", "layers": those layers' kind, treatment, ownership (owned/fenced CPUs, or None), CPUs and the
    planner's reasons}. Raises NoSuchTask."""
    proc = inventory.process(task_id)
    tid: Optional[int] = None
    if proc is None:
        thread = inventory.thread(task_id)
        proc = inventory.process(thread.pid) if thread is not None else None
        if proc is None:
            raise NoSuchTask(f"no process or thread {task_id}")
        tid = task_id
    workload = match.workload_of(proc.pid)
    threads = [t for t in (workload.threads if workload else ()) if t.pid == proc.pid and (tid is None or t.tid == tid)]
    layer_of = {m: layer for layer in (layer_plan.layers if layer_plan else ()) for m in layer.selector.tids}
    layers = {layer_of[t.tid].name: layer_of[t.tid] for t in threads if t.tid in layer_of}
    return {
        "pid": proc.pid, "tid": tid, "process": proc.name, "unit": proc.unit,
        "unit_cgroup": proc.unit_cgroup, "system_unit": proc.system_unit is not None, "cgroup": proc.cgroup,
        "workload": dataclasses.asdict(workload) if workload else None,
        "why_not": None if workload else matcher.explain_unmatched(proc),
        "threads": [{**dataclasses.asdict(t), "layer": layer_of[t.tid].name if t.tid in layer_of else None}
                    for t in threads],
        "layers": {name: {"kind": layer.kind, "treatment": layer.treatment, "ownership": layer.holds_cpus,
                          "cpus": list(layer.cpus), "reasons": list(layer.reasons)}
                   for name, layer in sorted(layers.items())},
    }
