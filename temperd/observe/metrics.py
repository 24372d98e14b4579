"""Prometheus metrics: `temperd_` prefix, base units, `_total` counters, no pid/tid/cmdline labels.

The facts `temperctl status` shows too (the configuration, the backend and scx_layered, the
inventory, the workloads, the linter's violations, temperd's own cost) are read from the typed
Status at each scrape (status_metrics). The rest is one group per source, each updated from
that source's typed value only (the way node_exporter has one collector per source): the
backend's ApplyResult, the Observation (pressure, per-layer use, scheduling delay) and the
learner (classification and rightsizing).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Dict, Iterable, List, Optional

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric

from temperd.control.status import Status
from temperd.observe.observer import Observation
from temperd.observe.status_metrics import StatusMetrics
from temperd.sources.runqlat import BOUNDS_S, LatencyReport, metric_layer_name

if TYPE_CHECKING:
    from temperd.backends.result import ApplyResult


class ActionMetrics:
    """Scheduling changes, from each ApplyResult of the backend."""

    def __init__(self, r: CollectorRegistry) -> None:
        self.applied = Counter("temperd_actions_applied_total", "Scheduling changes made, by kind.", ["kind"], registry=r)
        self.failed = Counter("temperd_actions_failed_total", "Scheduling changes refused by the kernel, by kind.", ["kind"], registry=r)
        self.restored = Counter("temperd_actions_restored_total", "Settings put back to their original, by kind.", ["kind"], registry=r)

    def update(self, result: "ApplyResult") -> None:
        for table, counter in ((result.applied, self.applied), (result.failed, self.failed),
                               (result.restored, self.restored)):
            for kind, count in table.items():
                if count:
                    counter.labels(kind).inc(count)


class ObservationMetrics:
    """CPU pressure and per-layer use: from the Observation."""

    def __init__(self, r: CollectorRegistry) -> None:
        self.psi = Gauge("temperd_psi_cpu_avg10_ratio", "CPU pressure (PSI avg10) as a ratio 0..1.", ["kind"], registry=r)
        self.layer_util = Gauge("temperd_layer_cpu_usage_ratio", "Members' CPU use per layer, in CPUs.", ["layer"], registry=r)
        self.layer_members = Gauge("temperd_layer_members", "Member threads per layer.", ["layer"], registry=r)
        self.layer_cpus = Gauge("temperd_layer_cpus", "CPUs a layer owns (Confined, Grouped); 0 for Open layers.",
                                ["layer"], registry=r)
        self.layer_info = Gauge("temperd_layer_info", "Each layer of the plan (value 1) with its kind, treatment and tier.",
                                ["layer", "kind", "treatment", "tier"], registry=r)

    def update(self, observation: Observation) -> None:
        for kind in ("some", "full"):
            avg10 = observation.psi_avg10(kind)
            if avg10 is not None:
                self.psi.labels(kind).set(avg10 / 100.0)
        # Labelled by the layer's name without a pid (metric_layer_name); layers that share one add up.
        util: Dict[str, float] = {}
        members: Dict[str, int] = {}
        cpus: Dict[str, int] = {}
        info = set()
        for layer in observation.layers:
            name = metric_layer_name(layer.name)
            util[name] = util.get(name, 0.0) + layer.util
            members[name] = members.get(name, 0) + layer.members
            cpus[name] = cpus.get(name, 0) + len(layer.cpus)
            info.add((name, layer.kind, layer.treatment, layer.tier))
        for gauge in (self.layer_util, self.layer_members, self.layer_cpus, self.layer_info):
            gauge.clear()
        for name in util:
            self.layer_util.labels(name).set(round(util[name], 4))
            self.layer_members.labels(name).set(members[name])
            self.layer_cpus.labels(name).set(cpus[name])
        for labels in info:
            self.layer_info.labels(*labels).set(1)


class LatencyMetrics:
    """Scheduling delay per layer, from the Observation's LatencyReport (sources.runqlat): a
    histogram whose buckets, count and sum are the source's running totals, so it is exposed
    by a collector of its own rather than observed value by value. Labels: the layer without a
    pid (metric_layer_name; layers that share one are added up) and the source (bpf or schedstat)."""

    def __init__(self, r: CollectorRegistry) -> None:
        self.report: Optional[LatencyReport] = None
        r.register(self)

    def update(self, report: Optional[LatencyReport]) -> None:
        self.report = report

    def describe(self):  # the registry asks for names before the first report exists
        return [HistogramMetricFamily("temperd_layer_runqueue_latency_seconds", ""),
                CounterMetricFamily("temperd_layer_offcpu", ""),
                GaugeMetricFamily("temperd_telemetry_source", "")]

    def collect(self):
        report = self.report
        hist = HistogramMetricFamily("temperd_layer_runqueue_latency_seconds",
                                     "Scheduling delay of layer members, wakeup (or preemption) to running, in "
                                     "seconds: per event from the bcc program (source bpf), or per-thread window "
                                     "means from schedstat (source schedstat: count and sum exact, the tail "
                                     "under-stated).", labels=["layer", "source"])
        offcpu = CounterMetricFamily("temperd_layer_offcpu", "Times layer members left the CPU, by reason "
                                     "(preempted, voluntary, uninterruptible); bcc program only.",
                                     labels=["layer", "reason"])
        source = GaugeMetricFamily("temperd_telemetry_source", "Where the scheduling delay comes from (value 1): "
                                   "bpf, or schedstat where bcc cannot load.", labels=["source"])
        if report is not None:
            source.add_metric([report.source], 1)
            merged: Dict[str, List] = {}
            offs: Dict[tuple, int] = {}
            for item in report.layers:
                name = metric_layer_name(item.layer)
                entry = merged.setdefault(name, [[0] * len(BOUNDS_S), 0, 0.0])
                for k, (_, cumulative) in enumerate(item.buckets()):
                    entry[0][k] += cumulative
                entry[1] += item.count
                entry[2] += item.sum_s
                for reason, n in item.offcpu.items():
                    offs[(name, reason)] = offs.get((name, reason), 0) + n
            for name, (buckets, count, total) in sorted(merged.items()):
                hist.add_metric([name, report.source],
                                [(repr(round(bound, 9)), n) for bound, n in zip(BOUNDS_S, buckets)] + [("+Inf", count)], total)
            for (name, reason), n in sorted(offs.items()):
                offcpu.add_metric([name, reason], n)
        yield hist
        yield offcpu
        yield source


class LearnerMetrics:
    """Each workload's classification and rightsizing, from WorkloadLearner: labelled by the workload's
    label (unit, binding cgroup or profile; never a pid), so the series stay bounded."""

    def __init__(self, r: CollectorRegistry) -> None:
        self.classes = Gauge("temperd_workload_class_info", "Each tracked workload's classification (value 1).",
                             ["workload", "criticality", "cpu_intensity", "cpu_bound", "cpu_cap_sensitivity",
                              "gpu_intensity"], registry=r)
        self.confidence = Gauge("temperd_workload_class_confidence", "Confidence of the classification, 0..1.",
                                ["workload"], registry=r)
        self.utilization = Gauge("temperd_workload_cpu_utilization_ratio", "CPU demand over the classification "
                                 "window as a share of the CPUs the workload can use.", ["workload"], registry=r)
        self.needed = Gauge("temperd_rightsize_needed_cpus", "CPUs the workload needs: exclusive cores for its hot "
                            "threads plus the shared remainder at p95 x (1 + margin).", ["workload"], registry=r)
        self.exclusive = Gauge("temperd_rightsize_exclusive_cores", "Hot threads (p95 >= 0.8 of a core) that need a "
                               "core of their own.", ["workload"], registry=r)
        self.declared = Gauge("temperd_rightsize_declared_cpus", "CPUs declared for the workload (quota, cpuset, "
                              "binding cpus); absent where nothing is declared.", ["workload"], registry=r)
        self.savings = Gauge("temperd_identified_savings_cpus", "Declared minus needed CPUs (negative: short).",
                             ["workload"], registry=r)
        self.host_savings = Gauge("temperd_host_identified_savings_cpus", "The host's identified savings: the sum of "
                                  "the workloads' positive savings.", registry=r)
        self.history_bytes = Gauge("temperd_rightsize_history_bytes", "Size of the rightsizing history file when last "
                                   "saved.", registry=r)

    def update(self, classifications, recommendations, history_bytes: int) -> None:
        for gauge in (self.classes, self.confidence, self.utilization, self.needed, self.exclusive, self.declared,
                      self.savings):
            gauge.clear()
        for c in classifications:
            self.classes.labels(c.workload, c.criticality, c.cpu_intensity, c.cpu_bound, c.cpu_cap_sensitivity,
                                c.gpu_intensity).set(1)
            self.confidence.labels(c.workload).set(c.confidence)
            if c.cpu_avg_utilization_pct is not None:
                self.utilization.labels(c.workload).set(c.cpu_avg_utilization_pct / 100.0)
        host_savings = 0.0
        for r in recommendations:
            self.needed.labels(r.workload).set(r.needed_cpus)
            self.exclusive.labels(r.workload).set(r.exclusive_cores)
            if r.declared_cpus is not None:
                self.declared.labels(r.workload).set(r.declared_cpus)
            if r.savings_cpus is not None:
                self.savings.labels(r.workload).set(r.savings_cpus)
                host_savings += max(0.0, r.savings_cpus)
        self.host_savings.set(round(host_savings, 2))
        self.history_bytes.set(history_bytes)


class Metrics:
    """Owns its registry (not the process-global one), so tests and the daemon never collide.
    status: the typed Status, built at each scrape (None until temperd has started)."""

    def __init__(self, status: Callable[[], Optional[Status]] = lambda: None) -> None:
        r = self.registry = CollectorRegistry()
        self.status = StatusMetrics(r, status)
        self.actions = ActionMetrics(r)
        self.observation = ObservationMetrics(r)
        self.latency = LatencyMetrics(r)
        self.learner = LearnerMetrics(r)

    def exposition(self) -> bytes:
        return generate_latest(_WithoutCreated(self.registry))


class _WithoutCreated:
    """The registry as exposed: without prometheus-client's `_created` samples, which would double
    every counter (and histogram) for a creation time nobody here queries. Filtered at
    exposition rather than with PROMETHEUS_DISABLE_CREATED_SERIES, which the library reads once
    at import and older versions do not know."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def collect(self) -> Iterable[Metric]:
        for family in self.registry.collect():
            kept = [s for s in family.samples if not s.name.endswith("_created")]
            if len(kept) != len(family.samples):
                family = _copy_family(family, kept)
            yield family


def _copy_family(family: Metric, samples) -> Metric:
    out = Metric(family.name, family.documentation, family.type, family.unit)
    out.samples = samples
    return out
