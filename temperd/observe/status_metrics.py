"""The metrics that are facts of the typed Status (control/status.py), each read from its
field when /metrics is scraped: the configuration and last reload, the backend and scx_layered,
the inventory, the workloads, the linter's violations and temperd's own cost. One Status is
built per scrape; a metric and `temperctl status` cannot disagree on the fact they share."""

from __future__ import annotations

from collections import Counter
from typing import Callable, Dict, Iterator, List, Optional, Tuple

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from temperd.control.status import Status
from temperd.observe.linter import INVARIANTS

# name (a counter's without _total), type, help, labels: in the order they are exposed
FAMILIES: Tuple[Tuple[str, str, str, Tuple[str, ...]], ...] = (
    ("temperd_config_generation", "gauge", "Generation of the configuration in force.", ()),
    ("temperd_config_last_reload_success", "gauge", "1 if the last reload was adopted, 0 if refused.", ()),
    ("temperd_config_last_reload_timestamp_seconds", "gauge", "When the last reload was tried.", ()),
    ("temperd_config_problems", "gauge", "Problems found by the last reload (bad files or keys).", ()),
    ("temperd_backend_info", "gauge", "The active backend (value 1).", ("backend",)),
    ("temperd_safe_mode", "gauge", "1 while the scx backend has fallen back to native after crashes.", ()),
    ("temperd_drift", "counter", "Settings temperd made that someone else changed, by kind.", ("kind",)),
    ("temperd_scx_restarts", "counter", "scx_layered restarts (each a window on the default scheduler).", ()),
    ("temperd_scx_starts", "counter", "scx_layered starts, restarts included.", ()),
    ("temperd_scx_crashes", "counter", "scx_layered exits temperd did not ask for.", ()),
    ("temperd_scx_refusals", "counter", "Starts refused because another sched_ext scheduler was loaded.", ()),
    ("temperd_scx_default_scheduler_seconds", "counter",
     "Time spent on the kernel's default scheduler between scx_layered runs.", ()),
    ("temperd_scx_running", "gauge", "1 while scx_layered is attached and carries the plan.", ()),
    ("temperd_scx_layer_cpu_usage_ratio", "gauge", "CPU use per scx_layered layer, in CPUs (its stats' util / 100).",
     ("layer",)),
    ("temperd_scx_layer_tasks", "gauge", "Tasks per scx_layered layer.", ("layer",)),
    ("temperd_scx_layer_cpus", "gauge", "CPUs scx_layered gives each layer now.", ("layer",)),
    ("temperd_inventory_events", "gauge", "Process events received since start.", ()),
    ("temperd_inventory_event_overflows", "gauge", "Event-buffer overflows since start.", ()),
    ("temperd_inventory_threads", "gauge", "Threads on the host known to the inventory.", ()),
    ("temperd_reconcile_cpu_seconds", "gauge", "CPU time of the last full /proc scan.", ()),
    ("temperd_event_passes", "counter", "Passes that handled process events since start.", ()),
    ("temperd_event_cpu_seconds", "counter", "CPU time of the passes that handled process events.", ()),
    ("temperd_workloads", "gauge", "Matched workloads by tier and profile.", ("tier", "profile")),
    ("temperd_lint_violations", "gauge", "Current placement-linter violations by invariant.", ("invariant",)),
    ("temperd_cpu_usage_ratio", "gauge", "temperd's own CPU use as a share of one core over the last window.", ()),
    ("temperd_observe_cpu_seconds", "gauge", "CPU time of the last observation sample.", ()),
)

Samples = Dict[str, List[Tuple[Tuple[str, ...], float]]]


class StatusMetrics:
    """A collector: at each scrape, status() (None until temperd has started: the families
    without samples) and the metric families read from it."""

    def __init__(self, registry, status: Callable[[], Optional[Status]]) -> None:
        self.status = status
        registry.register(self)

    def describe(self) -> List[Metric]:  # the registry asks for names before anything can be read
        return [_family(name, kind, text, labels) for name, kind, text, labels in FAMILIES]

    def collect(self) -> Iterator[Metric]:
        status = self.status()
        samples = samples_of(status) if status is not None else {}
        for name, kind, text, labels in FAMILIES:
            family = _family(name, kind, text, labels)
            for values, value in samples.get(name, ()):
                family.add_metric(list(values), value)
            yield family


def samples_of(status: Status) -> Samples:
    """Each family's (label values, value) from the status's fields."""
    out: Samples = {"temperd_config_generation": [((), status.generation)]}
    reload = status.last_reload
    if reload is not None:
        out["temperd_config_last_reload_success"] = [((), 1 if reload.ok else 0)]
        out["temperd_config_last_reload_timestamp_seconds"] = [((), reload.at)]
        out["temperd_config_problems"] = [((), len(reload.problems))]
    backend = status.backend
    out["temperd_backend_info"] = [((backend.carried_by,), 1)]
    out["temperd_safe_mode"] = [((), 1 if backend.safe_mode else 0)]
    out["temperd_drift"] = [((kind,), n) for kind, n in sorted(backend.drift.items())]
    out.update(_scx(status))
    inventory = status.inventory
    out["temperd_inventory_events"] = [((), inventory.events_received)]
    out["temperd_inventory_event_overflows"] = [((), inventory.events_lost)]
    out["temperd_inventory_threads"] = [((), inventory.threads)]
    out["temperd_reconcile_cpu_seconds"] = [((), inventory.last_reconcile_cpu_s)]
    if status.event_path is not None:
        out["temperd_event_passes"] = [((), status.event_path.passes)]
        out["temperd_event_cpu_seconds"] = [((), status.event_path.cpu_s)]
    out["temperd_workloads"] = sorted(Counter((w.tier, w.profile or "none") for w in status.workloads).items())
    every = {**dict.fromkeys(INVARIANTS, 0), **status.lint.by_invariant}  # every invariant, 0 where none
    out["temperd_lint_violations"] = [((k,), n) for k, n in every.items()]
    if status.overhead is not None:
        out["temperd_cpu_usage_ratio"] = [((), status.overhead.daemon_cpu_ratio)]
        out["temperd_observe_cpu_seconds"] = [((), status.overhead.sample_cpu_s)]
    return out


def _scx(status: Status) -> Samples:
    """scx_layered's supervisor counts (0 under the native backend) and its per-layer stats."""
    scx = status.backend.scx
    sup = scx.scx_layered if scx is not None else None
    out: Samples = {}
    for name, field in (("temperd_scx_restarts", "restarts"), ("temperd_scx_starts", "starts"),
                        ("temperd_scx_crashes", "crashes"), ("temperd_scx_refusals", "refusals")):
        out[name] = [((), getattr(sup, field) if sup is not None else 0)]
    out["temperd_scx_default_scheduler_seconds"] = [((), sup.default_scheduler_gap_s.total if sup is not None else 0)]
    out["temperd_scx_running"] = [((), 1 if sup is not None and sup.state == "running" else 0)]
    layers = scx.scx_stats.layers if scx is not None else {}
    # scx_layered's own field names (backends/scx/stats.py), present where it reported them
    for name, field, scale in (("temperd_scx_layer_cpu_usage_ratio", "util", 100.0),
                               ("temperd_scx_layer_tasks", "tasks", 1.0),
                               ("temperd_scx_layer_cpus", "cur_nr_cpus", 1.0)):
        out[name] = [((layer,), fields[field] / scale) for layer, fields in sorted(layers.items()) if field in fields]
    return out


def _family(name: str, kind: str, text: str, labels: Tuple[str, ...]) -> Metric:
    make = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
    return make(name, text, labels=list(labels))
