"""One observation sample every few seconds: what the scheduler did (observer), checked against
the plan (linter), handed to the metrics. The latest sample and lint report stay for
`temperctl status` and /observe."""

from __future__ import annotations

import time
from typing import FrozenSet, Mapping, Optional

from temperd.backends.status import NATIVE, BackendStatus
from temperd.config.daemon_config import DEFAULT_RUNQUEUE_LATENCY_P99_MS
from temperd.decide.matcher import MatchResult
from temperd.observe.linter import LintReport, RateLimitedLog, lint
from temperd.observe.metrics import Metrics
from temperd.observe.observer import Observation, Observer
from temperd.plan import LayerPlan
from temperd.sources.inventory import InventoryStats
from temperd.sources.runqlat import Telemetry


class Sampler:
    def __init__(self, shape, metrics: Metrics, *, latency_bound_s: Optional[float] = None,
                 telemetry: Optional[Telemetry] = None):
        """latency_bound_s: the runqueue_latency bound ([lint] runqueue_latency_p99_ms / 1000; the
        default's where None). telemetry: the scheduling-delay source, started on the first sample."""
        self.shape = shape
        self.metrics = metrics
        self.latency_bound_s = latency_bound_s if latency_bound_s is not None else DEFAULT_RUNQUEUE_LATENCY_P99_MS / 1e3
        self.telemetry = telemetry if telemetry is not None else Telemetry()
        self.observer = Observer(shape, telemetry=self.telemetry)
        self.lint_log = RateLimitedLog()
        self.observation: Optional[Observation] = None
        self.lint = LintReport()

    def reshape(self, shape) -> None:
        """The machine shape changed (CPU hotplug): observe anew against the new one."""
        self.shape = shape
        self.observer = Observer(shape, telemetry=self.telemetry)

    def update_membership(self, plan: LayerPlan) -> None:
        """The plan was applied: the telemetry's kernel-side tid -> layer filter follows it."""
        self.telemetry.start()
        self.telemetry.update_membership(plan)

    def close(self) -> None:
        self.telemetry.close()

    def sample(self, plan: LayerPlan, processes: Mapping[int, object], match: MatchResult, backend: BackendStatus,
               layer_cpus: Optional[Mapping[str, FrozenSet[int]]], inventory: InventoryStats) -> None:
        """backend: read once per sample (the scx backend's status reads its supervisor);
        layer_cpus: the backend's (Backend.layer_cpus)."""
        self.update_membership(plan)  # at once where the daemon calls it after each apply; a no-op then
        self.observation = self.observer.sample(plan, processes, match, time.time())
        self.lint = LintReport(tuple(lint(plan, self.observation, self.shape, match,
                                          check_treatment=backend.carried_by == NATIVE, confined_cpus=layer_cpus,
                                          latency_bound_s=self.latency_bound_s)))
        self.lint_log.report(self.lint.violations)
        self.metrics.observation.update(self.observation)
        self.metrics.lint.update(self.lint)
        self.metrics.latency.update(self.observation.latency)
        self.metrics.inventory.update(inventory)
        self.metrics.workloads.update(match.workloads)
        self.metrics.backend.update(backend)
        if backend.scx is not None:
            self.metrics.scx.update(backend.scx)
