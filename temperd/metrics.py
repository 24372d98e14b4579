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
