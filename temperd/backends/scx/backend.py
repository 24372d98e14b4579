"""The scx backend: the plan carried out by scx_layered, with the native backend as its fallback.

scx_layered schedules every task on the host once it runs, and it matches new threads itself
(by cgroup and thread-name prefix), so this backend has nothing to do per thread. It renders the
plan (render.py), hands it to the supervisor (supervisor.py: start, batched restarts, stats,
safe mode) and steps aside for the native backend when

- the plan cannot be expressed as a scx_layered config (RenderError: too many layers, ...),
- the supervisor is in safe mode (a crash loop) or refused to start (another sched_ext
  scheduler holds the kernel),
- scx_layered has not attached yet: while it loads, and in the gap of a restart, the kernel's
  default scheduler runs and nothing would carry the plan. On a crowded host that gap is long
  (the BPF load competes with the work it is to order) and the background tier would not yield
  to the loader either; the native backend holds the plan until it attaches.

The switch both ways happens in apply(), which the daemon calls under its lock (on its main
loop, or on the control socket's thread for `temperctl reload`): the supervisor's callbacks
(safe mode, attached, an attached one gone) run on the supervisor's thread and only ask the main
loop for a replan (on_carrier_change). Threads the native backend changed are restored when
scx_layered takes over again, so the two never stack.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Dict, FrozenSet, Iterable, Mapping, Optional, Tuple

from temperd.plan import LayerPlan
from temperd.backends.native.backend import NativeBackend
from temperd.backends.result import ApplyResult
from temperd.backends.scx.render import Rendered, RenderError, render_plan
from temperd.backends.scx.restarts import RestartPolicy
from temperd.backends.scx.stats import layer_cpus, scx_layer_views, stats_view
from temperd.backends.scx.status import BACKOFF, RUNNING
from temperd.backends.scx.supervisor import ScxConfigError, ScxSupervisor
from temperd.backends.status import NATIVE, SCX, BackendStatus
from temperd.control.status import ScxView

log = logging.getLogger("temperd.backend")


def restart_policy(settings) -> RestartPolicy:
    """The supervisor's policy from temperd.toml's [scx] table."""
    return RestartPolicy(min_interval_s=settings.min_restart_interval_s, crash_limit=settings.crash_limit,
                         crash_window_s=settings.crash_window_s)


class ScxBackend:
    """Same interface as NativeBackend: recover, apply, on_new_threads, stop, status."""

    def __init__(self, supervisor: ScxSupervisor, native: NativeBackend, cpu_count: int,
                 on_carrier_change: Optional[Callable[[str], None]] = None):
        self.supervisor = supervisor
        self.native = native
        self.cpu_count = cpu_count
        self.on_carrier_change = on_carrier_change  # set by the daemon: ask its main loop to replan
        supervisor.on_safe_mode = self._ask_replan
        supervisor.on_attach = lambda attached: self._ask_replan(
            "scx_layered attached" if attached else "scx_layered exited")
        self.carried_by = SCX
        self.fallback_reason: Optional[str] = None
        self.rendered: Optional[Rendered] = None
        self.render_problems: Tuple[str, ...] = ()
        self._native_held = False  # the native backend holds thread settings that need restoring

    # ---- the backend interface -------------------------------------------------------------------

    def recover(self) -> ApplyResult:
        """Settings a crashed run of the native backend (or of this fallback) left behind."""
        return self.native.recover()

    def apply(self, plan: LayerPlan, threads: Iterable, changed: Optional[Iterable] = None) -> ApplyResult:
        try:
            rendered = render_plan(plan, self.cpu_count, gpu_support=self.supervisor.gpu_support)
        except RenderError as exc:
            self.rendered, self.render_problems = None, exc.problems
            return self._carry_natively(plan, threads, str(exc), changed)
        self.rendered, self.render_problems = rendered, ()
        if self.supervisor.safe_mode:
            return self._carry_natively(plan, threads, self.supervisor.safe_mode_reason or "scx_layered safe mode",
                                        changed)
        try:
            self.supervisor.apply(rendered.config, rendered.options)
        except ScxConfigError as exc:  # render_plan validates too: this is a disagreement between the two
            self.render_problems = exc.problems
            return self._carry_natively(plan, threads, str(exc), changed)
        self.supervisor.start()
        if self.supervisor.state != RUNNING:
            why = "waits to start again after it exited" if self.supervisor.state == BACKOFF else "is starting"
            return self._carry_natively(plan, threads, f"scx_layered {why}: the native backend holds the plan until "
                                        "it attaches", changed, waiting=True)
        result = ApplyResult()
        if self.carried_by != SCX:
            log.info("scx backend: scx_layered carries the plan again (was native: %s)", self.fallback_reason)
        self.carried_by, self.fallback_reason = SCX, None
        if self._native_held:
            restored = self.native.stop()
            self._native_held = False
            result.merge(restored)
            result.notes.append("scx_layered carries the plan: threads the native fallback changed were restored")
        result.notes.extend(str(note) for note in rendered.notes)
        return result

    def retry(self) -> bool:
        """After a reload: leave safe mode (or a refusal) and try scx_layered again on the next apply.

        True when there was something to retry."""
        if not self.supervisor.safe_mode:
            return False
        log.info("scx backend: trying scx_layered again (was: %s)", self.supervisor.safe_mode_reason)
        self.supervisor.clear_safe_mode()
        return True

    def on_new_threads(self, threads: Iterable) -> ApplyResult:
        if self.carried_by == NATIVE:
            return self.native.on_new_threads(threads)
        return ApplyResult()  # scx_layered matches new threads itself

    def forget_threads(self, tids: Iterable[int], live: Optional[Mapping[int, Any]] = None) -> None:
        self.native.forget_threads(tids, live)

    def stop(self) -> ApplyResult:
        self.supervisor.stop()
        return self.native.stop()

    def layer_cpus(self) -> Optional[Dict[str, FrozenSet[int]]]:
        """The CPUs scx_layered gives each layer now (from its stats), for the linter.

        None while the native fallback carries the plan: then the plan's CPU numbers are real."""
        if self.carried_by == NATIVE:
            return None
        return layer_cpus(self.supervisor.stats())

    def status(self) -> BackendStatus:
        latest = self.supervisor.stats()
        scx = ScxView(
            fallback_reason=self.fallback_reason,
            safe_mode=self.supervisor.safe_mode,
            safe_mode_reason=self.supervisor.safe_mode_reason,
            render_notes=[str(note) for note in self.rendered.notes] if self.rendered else [],
            render_problems=list(self.render_problems),
            scx_layered=self.supervisor.status(),
            scx_stats=stats_view(latest),
        )
        return BackendStatus(carried_by=self.carried_by, drift=self.native.drift_counts, scx=scx,
                             scx_layers=scx_layer_views(latest))

    # ---- falling back ----------------------------------------------------------------------------

    def _carry_natively(self, plan: LayerPlan, threads: Iterable, reason: str,
                        changed: Optional[Iterable] = None, waiting: bool = False) -> ApplyResult:
        """waiting: scx_layered is loading or restarting, as expected (said at info, not as a warning)."""
        if self.carried_by != NATIVE or reason != self.fallback_reason:
            log.log(logging.INFO if waiting else logging.WARNING, "scx backend: the native backend carries the plan: %s",
                    reason)
            changed = None  # the native backend takes over: every thread
        self.carried_by, self.fallback_reason = NATIVE, reason
        result = self.native.apply(plan, threads, changed)
        self._native_held = True
        result.notes.append(f"native fallback: {reason}")
        return result

    def _ask_replan(self, reason: str) -> None:
        """From the supervisor's thread: safe mode, a refusal, attached, or an attached one gone.
        The main loop's next apply switches over."""
        if self.on_carrier_change is not None:
            self.on_carrier_change(reason)
