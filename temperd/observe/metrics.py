"""Prometheus metrics: `temperd_` prefix, base units, `_total` counters, no pid/tid/cmdline labels."""

from __future__ import annotations

from typing import Any, Dict, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

LINT_INVARIANTS = ("smt_collision", "protected_fallback", "open_reserve", "layer_mismatch")


class Metrics:
    """Owns its registry (not the process-global one), so tests and the daemon never collide."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.workloads = Gauge("temperd_workloads", "Matched workloads by tier and profile.", ["tier", "profile"], registry=r)
        self.generation = Gauge("temperd_config_generation", "Generation of the configuration in force.", registry=r)
        self.reload_ok = Gauge("temperd_config_last_reload_success", "1 if the last reload was adopted, 0 if refused.", registry=r)
        self.reload_time = Gauge("temperd_config_last_reload_timestamp_seconds", "When the last reload was tried.", registry=r)
        self.reload_problems = Gauge("temperd_config_problems", "Problems found by the last reload (bad files or keys).", registry=r)
        self.backend = Gauge("temperd_backend_info", "The active backend (value 1).", ["backend"], registry=r)
        self.safe_mode = Gauge("temperd_safe_mode", "1 while the scx backend has fallen back to native after crashes.", registry=r)
        self.actions = Counter("temperd_actions_applied_total", "Scheduling changes made, by kind.", ["kind"], registry=r)
        self.failures = Counter("temperd_actions_failed_total", "Scheduling changes refused by the kernel, by kind.", ["kind"], registry=r)
        self.restored = Counter("temperd_actions_restored_total", "Settings put back to their original, by kind.", ["kind"], registry=r)
        self.drift = Counter("temperd_drift_total", "Settings temperd made that someone else changed, by kind.", ["kind"], registry=r)
        self.events = Gauge("temperd_inventory_events", "Process events received since start.", registry=r)
        self.events_lost = Gauge("temperd_inventory_event_overflows", "Event-buffer overflows since start.", registry=r)
        self.threads = Gauge("temperd_inventory_threads", "Threads on the host known to the inventory.", registry=r)
        self.reconcile_cpu = Gauge("temperd_reconcile_cpu_seconds", "CPU time of the last full /proc scan.", registry=r)
        self.psi = Gauge("temperd_psi_cpu_avg10_ratio", "CPU pressure (PSI avg10) as a ratio 0..1.", ["kind"], registry=r)
        self.lint = Gauge("temperd_lint_violations", "Current placement-linter violations by invariant.", ["invariant"], registry=r)
        self.own_cpu = Gauge("temperd_cpu_usage_ratio", "temperd's own CPU use as a share of one core over the last window.", registry=r)
        self.observe_cpu = Gauge("temperd_observe_cpu_seconds", "CPU time of the last observation sample.", registry=r)
        self.layer_util = Gauge("temperd_layer_cpu_usage_ratio", "Members' CPU use per layer, in CPUs.", ["layer"], registry=r)
        self.layer_members = Gauge("temperd_layer_members", "Member threads per layer.", ["layer"], registry=r)
        self.scx_restarts = Counter("temperd_scx_restarts_total", "scx_layered restarts (each a window on the default scheduler).", registry=r)
        self.scx_starts = Counter("temperd_scx_starts_total", "scx_layered starts, restarts included.", registry=r)
        self.scx_crashes = Counter("temperd_scx_crashes_total", "scx_layered exits temperd did not ask for.", registry=r)
        self.scx_refusals = Counter("temperd_scx_refusals_total", "Starts refused because another sched_ext scheduler was loaded.", registry=r)
        self.scx_gap = Counter("temperd_scx_default_scheduler_seconds_total", "Time spent on the kernel's default scheduler between scx_layered runs.", registry=r)
        self.scx_running = Gauge("temperd_scx_running", "1 while scx_layered is attached and carries the plan.", registry=r)
        self.scx_util = Gauge("temperd_scx_layer_cpu_usage_ratio", "CPU use per scx_layered layer, in CPUs (its stats' util / 100).", ["layer"], registry=r)
        self.scx_tasks = Gauge("temperd_scx_layer_tasks", "Tasks per scx_layered layer.", ["layer"], registry=r)
        self.scx_cpus = Gauge("temperd_scx_layer_cpus", "CPUs scx_layered gives each layer now.", ["layer"], registry=r)
        self._scx_seen: Dict[Counter, float] = {}  # last cumulative value seen, per counter
        for invariant in LINT_INVARIANTS:
            self.lint.labels(invariant).set(0)

    def record_apply(self, result: Any) -> None:
        """After each backend apply: counters by kind from the result's applied/failed/restored/drift tables."""
        for table, counter in (("applied", self.actions), ("failed", self.failures),
                               ("restored", self.restored), ("drift", self.drift)):
            for kind, count in (getattr(result, table, None) or {}).items():
                if count:
                    counter.labels(kind).inc(count)

    def record_reload(self, ok: bool, generation: int, at: float, problems: int) -> None:
        self.reload_ok.set(1 if ok else 0)
        self.generation.set(generation)
        self.reload_time.set(at)
        self.reload_problems.set(problems)

    def set_backend(self, active: str, safe_mode: bool) -> None:
        self.backend.clear()
        self.backend.labels(active).set(1)
        self.safe_mode.set(1 if safe_mode else 0)

    def record_scx(self, status: Dict[str, Any], stats: Dict[str, Any]) -> None:
        """From the scx backend's status: supervisor counters (cumulative there, so counted as
        increments here) and the summarized scx_layered stats."""
        totals = ((self.scx_restarts, status.get("restarts", 0)), (self.scx_starts, status.get("starts", 0)),
                  (self.scx_crashes, status.get("crashes", 0)), (self.scx_refusals, status.get("refusals", 0)),
                  (self.scx_gap, (status.get("default_scheduler_gap_s") or {}).get("total", 0.0)))
        for counter, total in totals:
            grown = total - self._scx_seen.get(counter, 0)
            if grown > 0:
                counter.inc(grown)
            self._scx_seen[counter] = total
        self.scx_running.set(1 if status.get("state") == "running" else 0)
        for gauge in (self.scx_util, self.scx_tasks, self.scx_cpus):
            gauge.clear()
        for layer, fields in (stats.get("layers") or {}).items():
            if "util" in fields:
                self.scx_util.labels(layer).set(fields["util"] / 100.0)
            if "tasks" in fields:
                self.scx_tasks.labels(layer).set(fields["tasks"])
            if "cur_nr_cpus" in fields:
                self.scx_cpus.labels(layer).set(fields["cur_nr_cpus"])

    def set_workloads(self, workloads: Iterable[Any]) -> None:
        counts: Dict[tuple, int] = {}
        for w in workloads:
            key = (w.tier, w.profile_id or "none")
            counts[key] = counts.get(key, 0) + 1
        self.workloads.clear()
        for (tier, profile), n in counts.items():
            self.workloads.labels(tier, profile).set(n)

    def record_inventory(self, stats: Any) -> None:
        self.events.set(stats.events_received)
        self.events_lost.set(stats.events_lost)
        self.threads.set(stats.threads)
        self.reconcile_cpu.set(stats.last_reconcile_cpu_s)

    def record_observation(self, observation: Any) -> None:
        if observation.psi:
            for kind in ("some", "full"):
                if kind in observation.psi:
                    self.psi.labels(kind).set(observation.psi[kind]["avg10"] / 100.0)
        self.own_cpu.set(observation.overhead.daemon_cpu_ratio)
        self.observe_cpu.set(observation.overhead.sample_cpu_s)
        self.layer_util.clear()
        self.layer_members.clear()
        for layer in observation.layers:
            self.layer_util.labels(layer.name).set(layer.util)
            self.layer_members.labels(layer.name).set(layer.members)

    def set_lint(self, violations: Iterable[Any]) -> None:
        counts = {invariant: 0 for invariant in LINT_INVARIANTS}
        for violation in violations:
            counts[violation.invariant] = counts.get(violation.invariant, 0) + 1
        for invariant, n in counts.items():
            self.lint.labels(invariant).set(n)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
