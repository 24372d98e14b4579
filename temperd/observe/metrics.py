"""Prometheus metrics: `temperd_` prefix, base units, `_total` counters, no pid/tid/cmdline labels.

One group of metrics per source, each updated from that source's typed status only (the way
node_exporter has one collector per source): a reload's outcome, the backend's ApplyResult, its
BackendStatus, the scx backend's ScxStatus, the InventoryStats, the matched workloads, the
Observation and the LintReport. `temperctl status` and /observe read the same objects.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, Hashable, Iterable, List, Optional

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric

from temperd.observe.linter import LintReport
from temperd.observe.observer import Observation
from temperd.sources.runqlat import BOUNDS_S, LatencyReport, metric_layer_name

if TYPE_CHECKING:
    from temperd.backends.result import ApplyResult
    from temperd.backends.scx.status import ScxStatus
    from temperd.backends.status import BackendStatus
    from temperd.decide.matcher import Workload
    from temperd.sources.inventory import InventoryStats


class _RunningTotals:
    """For counters whose source keeps the running total: what each total grew by since it was last seen."""

    def __init__(self) -> None:
        self._seen: Dict[Hashable, float] = {}

    def grown(self, key: Hashable, total: float) -> float:
        before = self._seen.get(key, 0)
        self._seen[key] = total
        return total - before if total > before else 0


class ConfigMetrics:
    """The configuration in force and the last reload's outcome."""

    def __init__(self, r: CollectorRegistry) -> None:
        self.generation = Gauge("temperd_config_generation", "Generation of the configuration in force.", registry=r)
        self.reload_ok = Gauge("temperd_config_last_reload_success", "1 if the last reload was adopted, 0 if refused.", registry=r)
        self.reload_time = Gauge("temperd_config_last_reload_timestamp_seconds", "When the last reload was tried.", registry=r)
        self.reload_problems = Gauge("temperd_config_problems", "Problems found by the last reload (bad files or keys).", registry=r)

    def update(self, ok: bool, generation: int, at: float, problems: int) -> None:
        self.reload_ok.set(1 if ok else 0)
        self.generation.set(generation)
        self.reload_time.set(at)
        self.reload_problems.set(problems)


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


class BackendMetrics:
    """Who carries the plan, safe mode, and drift: from the BackendStatus."""

    def __init__(self, r: CollectorRegistry) -> None:
        self.info = Gauge("temperd_backend_info", "The active backend (value 1).", ["backend"], registry=r)
        self.safe_mode = Gauge("temperd_safe_mode", "1 while the scx backend has fallen back to native after crashes.", registry=r)
        self.drift = Counter("temperd_drift_total", "Settings temperd made that someone else changed, by kind.", ["kind"], registry=r)
        self._totals = _RunningTotals()

    def update(self, status: "BackendStatus") -> None:
        self.info.clear()
        self.info.labels(status.carried_by).set(1)
        self.safe_mode.set(1 if status.safe_mode else 0)
        for kind, total in status.drift.items():
            grown = self._totals.grown(kind, total)
            if grown:
                self.drift.labels(kind).inc(grown)


class ScxMetrics:
    """scx_layered's process (supervisor counters, cumulative there) and its per-layer stats."""

    def __init__(self, r: CollectorRegistry) -> None:
        self.restarts = Counter("temperd_scx_restarts_total", "scx_layered restarts (each a window on the default scheduler).", registry=r)
        self.starts = Counter("temperd_scx_starts_total", "scx_layered starts, restarts included.", registry=r)
        self.crashes = Counter("temperd_scx_crashes_total", "scx_layered exits temperd did not ask for.", registry=r)
        self.refusals = Counter("temperd_scx_refusals_total", "Starts refused because another sched_ext scheduler was loaded.", registry=r)
        self.gap = Counter("temperd_scx_default_scheduler_seconds_total", "Time spent on the kernel's default scheduler between scx_layered runs.", registry=r)
        self.running = Gauge("temperd_scx_running", "1 while scx_layered is attached and carries the plan.", registry=r)
        self.util = Gauge("temperd_scx_layer_cpu_usage_ratio", "CPU use per scx_layered layer, in CPUs (its stats' util / 100).", ["layer"], registry=r)
        self.tasks = Gauge("temperd_scx_layer_tasks", "Tasks per scx_layered layer.", ["layer"], registry=r)
        self.cpus = Gauge("temperd_scx_layer_cpus", "CPUs scx_layered gives each layer now.", ["layer"], registry=r)
        self._totals = _RunningTotals()

    def update(self, status: "ScxStatus") -> None:
        supervisor = status.supervisor
        for counter, total in ((self.restarts, supervisor.restarts), (self.starts, supervisor.starts),
                               (self.crashes, supervisor.crashes), (self.refusals, supervisor.refusals),
                               (self.gap, supervisor.default_scheduler_gap_total_s)):
            grown = self._totals.grown(counter, total)
            if grown:
                counter.inc(grown)
        self.running.set(1 if supervisor.state == "running" else 0)
        for gauge in (self.util, self.tasks, self.cpus):
            gauge.clear()
        # scx_layered's own field names (supervisor.LAYER_STAT_FIELDS), present where it reported them
        for layer, fields in status.layer_stats.items():
            if "util" in fields:
                self.util.labels(layer).set(fields["util"] / 100.0)
            if "tasks" in fields:
                self.tasks.labels(layer).set(fields["tasks"])
            if "cur_nr_cpus" in fields:
                self.cpus.labels(layer).set(fields["cur_nr_cpus"])


class InventoryMetrics:
    """Process events and /proc scans: from the InventoryStats."""

    def __init__(self, r: CollectorRegistry) -> None:
        self.events = Gauge("temperd_inventory_events", "Process events received since start.", registry=r)
        self.events_lost = Gauge("temperd_inventory_event_overflows", "Event-buffer overflows since start.", registry=r)
        self.threads = Gauge("temperd_inventory_threads", "Threads on the host known to the inventory.", registry=r)
        self.reconcile_cpu = Gauge("temperd_reconcile_cpu_seconds", "CPU time of the last full /proc scan.", registry=r)

    def update(self, stats: "InventoryStats") -> None:
        self.events.set(stats.events_received)
        self.events_lost.set(stats.events_lost)
        self.threads.set(stats.threads)
        self.reconcile_cpu.set(stats.last_reconcile_cpu_s)


class WorkloadMetrics:
    """Matched workloads by tier and profile."""

    def __init__(self, r: CollectorRegistry) -> None:
        self.workloads = Gauge("temperd_workloads", "Matched workloads by tier and profile.", ["tier", "profile"], registry=r)

    def update(self, workloads: Iterable["Workload"]) -> None:
        counts: Dict[tuple, int] = {}
        for w in workloads:
            key = (w.tier, w.profile_id or "none")
            counts[key] = counts.get(key, 0) + 1
        self.workloads.clear()
        for (tier, profile), n in counts.items():
            self.workloads.labels(tier, profile).set(n)


class ObservationMetrics:
    """CPU pressure, temperd's own cost and per-layer use: from the Observation."""

    def __init__(self, r: CollectorRegistry) -> None:
        self.psi = Gauge("temperd_psi_cpu_avg10_ratio", "CPU pressure (PSI avg10) as a ratio 0..1.", ["kind"], registry=r)
        self.own_cpu = Gauge("temperd_cpu_usage_ratio", "temperd's own CPU use as a share of one core over the last window.", registry=r)
        self.observe_cpu = Gauge("temperd_observe_cpu_seconds", "CPU time of the last observation sample.", registry=r)
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
        self.own_cpu.set(observation.overhead.daemon_cpu_ratio)
        self.observe_cpu.set(observation.overhead.sample_cpu_s)
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
                                [(_le(bound), n) for bound, n in zip(BOUNDS_S, buckets)] + [("+Inf", count)], total)
            for (name, reason), n in sorted(offs.items()):
                offcpu.add_metric([name, reason], n)
        yield hist
        yield offcpu
        yield source


def _le(bound: float) -> str:
    return repr(round(bound, 9))


class LintMetrics:
    """Placement-linter violations by invariant (every invariant, 0 where none): from the LintReport."""

    def __init__(self, r: CollectorRegistry) -> None:
        self.violations = Gauge("temperd_lint_violations", "Current placement-linter violations by invariant.", ["invariant"], registry=r)
        self.update(LintReport())

    def update(self, report: LintReport) -> None:
        for invariant, n in report.counts().items():
            self.violations.labels(invariant).set(n)


class WatchMetrics:
    """Each workload's classification and rightsizing, from WorkloadWatch: labelled by the workload's
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
    """Owns its registry (not the process-global one), so tests and the daemon never collide."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.workloads = WorkloadMetrics(r)
        self.config = ConfigMetrics(r)
        self.backend = BackendMetrics(r)
        self.actions = ActionMetrics(r)
        self.inventory = InventoryMetrics(r)
        self.observation = ObservationMetrics(r)
        self.lint = LintMetrics(r)
        self.scx = ScxMetrics(r)
        self.latency = LatencyMetrics(r)
        self.watch = WatchMetrics(r)

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
