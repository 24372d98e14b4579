"""One observation sample every few seconds: what the scheduler did (observer), checked against
the plan (linter), its pressure, per-layer use and scheduling delay handed to the metrics. The
latest sample and lint report stay for the status (its lint and overhead) and /observe.

The daemon's samples are taken on a thread of their own (`sample_in_background`): a sample reads
three files of every watched thread, 50-90 ms of a fork storm's thousand threads, and process
events waited behind it on the main loop. Everything a sample reads of the daemon is immutable
(the plan, the inventory's snapshot, the match), and one lock keeps two samples from running at
once.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import FrozenSet, Mapping, Optional

from temperd.backends.status import NATIVE, BackendStatus
from temperd.config.daemon_config import LINT_SPEC
from temperd.decide.matcher import MatchResult
from temperd.observe.linter import LintReport, RateLimitedLog, lint
from temperd.observe.metrics import Metrics
from temperd.observe.observer import Observation, Observer
from temperd.plan import LayerPlan
from temperd.sources.runqlat import Telemetry

log = logging.getLogger(__name__)


class Sampler:
    def __init__(self, shape, metrics: Metrics, *, latency_bound_s: Optional[float] = None,
                 telemetry: Optional[Telemetry] = None):
        """latency_bound_s: the runqueue_latency bound ([lint] runqueue_latency_p99_ms / 1000; the
        default's where None). telemetry: the scheduling-delay source, started on the first sample."""
        self.shape = shape
        self.metrics = metrics
        self.latency_bound_s = (latency_bound_s if latency_bound_s is not None
                                else LINT_SPEC.default_of("runqueue_latency_p99_ms") / 1e3)
        self.telemetry = telemetry if telemetry is not None else Telemetry()
        self.observer = Observer(shape, telemetry=self.telemetry)
        self.lint_log = RateLimitedLog()
        self.observation: Optional[Observation] = None
        self.lint = LintReport()
        self._one_at_a_time = threading.Lock()
        self._worker: Optional[ThreadPoolExecutor] = None  # made at the first background sample
        self._pending: Optional[Future] = None

    def reshape(self, shape) -> None:
        """The machine shape changed (CPU hotplug): observe anew against the new one."""
        self.shape = shape
        self.observer = Observer(shape, telemetry=self.telemetry)

    def update_membership(self, plan: LayerPlan) -> None:
        """The plan was applied: the telemetry's kernel-side tid -> layer filter follows it."""
        self.telemetry.start()
        self.telemetry.update_membership(plan)

    def close(self) -> None:
        if self._worker is not None:
            self._worker.shutdown(wait=True)  # a sample under way ends before the telemetry does
        self.telemetry.close()

    def sample_in_background(self, plan: LayerPlan, processes: Mapping[int, object], match: MatchResult,
                             backend: BackendStatus, layer_cpus: Optional[Mapping[str, FrozenSet[int]]]) -> bool:
        """sample() on the sampler's thread; False (nothing done) while the last one still runs.
        The telemetry's membership follows the plan here, on the caller's thread, as after each apply."""
        if self._pending is not None and not self._pending.done():
            return False
        self.update_membership(plan)
        if self._worker is None:
            self._worker = ThreadPoolExecutor(1, thread_name_prefix="temperd-observe")
        self._pending = self._worker.submit(self._take, plan, processes, match, backend, layer_cpus)
        self._pending.add_done_callback(_log_failure)
        return True

    def sample(self, plan: LayerPlan, processes: Mapping[int, object], match: MatchResult, backend: BackendStatus,
               layer_cpus: Optional[Mapping[str, FrozenSet[int]]]) -> None:
        """backend: read once per sample (the scx backend's status reads its supervisor);
        layer_cpus: the backend's (Backend.layer_cpus)."""
        self.update_membership(plan)  # at once where the daemon calls it after each apply; a no-op then
        self._take(plan, processes, match, backend, layer_cpus)

    def _take(self, plan: LayerPlan, processes: Mapping[int, object], match: MatchResult, backend: BackendStatus,
              layer_cpus: Optional[Mapping[str, FrozenSet[int]]]) -> None:
        with self._one_at_a_time:
            observation = self.observer.sample(plan, processes, match, time.time())
            self.lint = LintReport(tuple(lint(plan, observation, self.shape, match,
                                              check_treatment=backend.carried_by == NATIVE, confined_cpus=layer_cpus,
                                              latency_bound_s=self.latency_bound_s)))
            self.observation = observation
            self.lint_log.report(self.lint.violations)
            self.metrics.observation.update(observation)
            self.metrics.latency.update(observation.latency)


def _log_failure(done: Future) -> None:
    """A background sample that failed: said, and the next one is taken as usual."""
    exc = done.exception()
    if exc is not None:
        log.error("observation sample failed: %s: %s", type(exc).__name__, exc)
