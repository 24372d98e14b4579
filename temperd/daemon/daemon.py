"""temperd: one process that loads config and profiles, keeps the inventory, plans, applies through
the backend, observes and serves.

The Daemon holds the running state and makes every change to it: start, replan, reload, an
observation sample, stop. What only reads the state lives beside it (status_report,
control_commands, explain); the main loop, the sd_notify wrapper, the single-instance lock and
the serving threads have modules of their own.

Threads (docs/architecture.md): the main loop (main_loop.py) handles process events, scans,
requests, replans and observation samples. The control socket serves each client on a thread of
its own, where `temperctl reload` reloads, replans and applies. HTTP serves each request on a
thread of its own, where /observe may take the first observation sample. The watchers and the
scx supervisor only ask the main loop for something (request()). Everything that reads or
changes the state, the inventory or the backend holds `lock`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any, Dict, List, Optional

from temperd import __version__
from temperd.backends import Backend, BackendStatus
from temperd.backends.select import BackendChoice, make_backend
from temperd.config.daemon_config import DEFAULT_CONFIG_DIR, DaemonConfig
from temperd.config.errors import ConfigError
from temperd.config.label_key import load_label_key
from temperd.control.status import ReloadView, Status
from temperd.daemon import status_report
from temperd.daemon.control_commands import ControlCommands
from temperd.daemon.instance_lock import AlreadyRunning, InstanceLock
from temperd.daemon.main_loop import REPLAN, MainLoop, Requests
from temperd.decide.sizing import NO_SIZING, GroupKey, Sizing, member_counts, sized_workloads
from temperd.daemon.notify import Notifier
from temperd.daemon.reload import ViewLoader, restart_only_changes, summary_of
from temperd.daemon.services import Services
from temperd.decide.hostview import HostView, all_profiles, decide, make_matcher
from temperd.decide.planner import PlanMemo
from temperd.decide.busiest import RankedProcesses
from temperd.decide.candidates import candidate_index
from temperd.decide.matcher import Matcher, MatchResult, RuntimeBinding
from temperd.observe.journal import Journal
from temperd.observe.metrics import Metrics
from temperd.observe.sampler import Sampler
from temperd.observe.learner import WorkloadLearner, settled
from temperd.plan import LayerPlan
from temperd.sources import procfs
from temperd.sources.inventory import Inventory
from temperd.sources.runqlat import Telemetry
from temperd.sources.shape import SYSFS_ROOT, ShapeError
from temperd.trace.capture import cleanup_stale_instances

log = logging.getLogger("temperd")

OBSERVE_INTERVAL_S = 5.0


class StartupError(Exception):
    """temperd cannot start; the message says why."""


class Daemon:
    def __init__(self, config_dir: str = DEFAULT_CONFIG_DIR, sysfs_root: str = SYSFS_ROOT, *,
                 state_dir: Optional[str] = None, http_port: Optional[int] = None,
                 control_socket: Optional[str] = None, observe_interval_s: float = OBSERVE_INTERVAL_S):
        self.config_dir = config_dir
        self.sysfs_root = sysfs_root
        self.loader = ViewLoader(config_dir, sysfs_root, dict(state_dir=state_dir, http_port=http_port, control_socket=control_socket))
        self.observe_interval_s = observe_interval_s
        self.lock = threading.RLock()
        self.notifier = Notifier()
        self.requests = Requests()
        self.services = Services()
        self.inventory = Inventory()
        self.metrics = Metrics(status=self.status)  # the status's facts, read at each scrape
        self.started_at = time.time()
        self.state = "starting"
        self.generation = 0
        self.view: Optional[HostView] = None
        self.matcher: Optional[Matcher] = None
        self.runtime_bindings: Dict[int, RuntimeBinding] = {}  # temperctl bind: until unbind, exit or stop
        self.match = MatchResult()
        self.plan: Optional[LayerPlan] = None
        self.plan_memo = PlanMemo()
        self.ranked = RankedProcesses()  # the processes of `busiest` groups' workloads, as of the last match
        self.last_reload: Optional[ReloadView] = None
        self.backend_choice: Optional[BackendChoice] = None
        self.backend: Optional[Backend] = None
        self.last_apply: Optional[Any] = None
        self.replans = 0
        self.event_passes = 0
        self.event_cpu_s = 0.0
        self._sizes: Dict[GroupKey, int] = {}  # exclusive groups' measured sizes the plan was made with
        self.sampler: Optional[Sampler] = None
        self.learner: Optional[WorkloadLearner] = None  # classification and rightsizing ([classify], [rightsizing])
        self.journal = Journal()  # what temperd did and why, for the operator's log
        self._instance_lock: Optional[InstanceLock] = None

    @property
    def config(self) -> DaemonConfig:
        assert self.view is not None
        return self.view.config

    # ---- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        """Everything up to serving, under the lock: the services started last may call in at once.

        StartupError, its message one line per problem, when temperd cannot start. The sockets
        are bound before the first change to the host, so a port or path taken fails early; a
        failure after that is a StartupError too, and stop() puts back what was changed."""
        with self.lock:
            view = _first_view(self.loader)
            self.view = view
            self.generation = 1
            self.last_reload = ReloadView(not view.problems, 1, time.time(), "start",
                                          [str(p) for p in view.problems], summary_of(view))
            self._instance_lock = _lock_instance(self.config.state_dir)
            # Kept beside the history: a hand-started workload's label is the same across restarts.
            self.label_key = load_label_key(os.path.dirname(view.config.learner.history_file))
            _cleanup_stale_traces()
            try:
                self.services.bind(self.config, ControlCommands(self).handlers(), self.metrics.exposition,
                                   self.observe_json)
            except OSError as exc:
                raise StartupError(f"error: {exc.strerror or exc}") from None
            try:
                self._load_learner(view)  # the history file is checked before anything changes
                self._start_backend(view)
                self.matcher = self._make_matcher(view)
                if not self.inventory.start():
                    log.warning("process events unavailable (%s): scanning /proc every %.0f s instead",
                                self.inventory.unavailable_reason, self.config.scan_interval(False))
                self.sampler = Sampler(view.shape, self.metrics,
                                       latency_bound_s=view.config.lint_runqueue_latency_p99_ms / 1e3,
                                       telemetry=Telemetry(want_bpf=view.config.telemetry_bpf))
                self.replan("start")
                self.sampler.telemetry.start()  # after the plan: a bcc compile waits behind the work it orders
                if self.learner is not None:
                    self.learner.start()
                self.services.serve(self.config, self.config_dir, self.request)
            except Exception as exc:  # whatever it is, the caller restores and exits with this line
                log.debug("start failed", exc_info=True)
                raise StartupError(f"error: cannot start: {describe_error(exc)}") from None
            self.state = "running"
            self.notifier.notify("READY=1")
            self._notify_status()
            log.info("temperd %s running: %s", __version__, status_report.status_line(self))

    def _make_matcher(self, view: HostView) -> Matcher:
        self.plan_memo = PlanMemo()  # its layers are the old matcher's workloads' and profiles'
        matcher = make_matcher(view, self.label_key)
        matcher.set_runtime_bindings(self.runtime_bindings)  # bindings outlive a reload
        self.inventory.set_gate(candidate_index(view, matcher))  # what a new process is checked by
        return matcher

    def set_runtime_bindings(self, bindings: Dict[int, RuntimeBinding], trigger: str) -> None:
        """Bind or unbind at run time (under the lock): replan now; threads that leave their
        group are put back as on any other change."""
        assert self.matcher is not None
        self.runtime_bindings = dict(bindings)
        self.matcher.set_runtime_bindings(self.runtime_bindings)
        self.inventory.set_gate(candidate_index(self.view, self.matcher))  # a bound process is tracked
        self.replan(trigger)

    def _start_backend(self, view: HostView) -> None:
        # The backend's online CPUs are the shape's in force: read at start and at each reload (CPU hotplug's).
        self.backend_choice, self.backend = make_backend(view.config, self.sysfs_root, view.shape,
                                                         online_cpus=lambda: frozenset(self.view.shape.cpus))
        log.info("backend %s: %s", self.backend_choice.active, self.backend_choice.reason)
        self.backend.on_carrier_change = lambda reason: self.request(REPLAN, f"scx: {reason}")
        self.backend.recover()

    def _load_learner(self, view: HostView) -> None:
        if not view.config.learner.sampling:
            return
        self.learner = WorkloadLearner(view.config.learner, len(view.shape.cpus), lambda: _tracked(self), self.metrics.learner)
        self.learner.history.load()  # once, before temperd changes anything on the host

    def run(self) -> None:
        """The main loop, until a stop request (SIGTERM, SIGINT)."""
        MainLoop(self).run()

    def request(self, kind: str, trigger: str) -> None:
        """From signal handlers and other threads: ask the main loop to stop, reload or replan."""
        self.requests.ask(kind, trigger)

    def install_signal_handlers(self) -> None:
        self.requests.install_signal_handlers()

    def stop(self) -> None:
        with self.lock:
            self.state = "stopping"
        self.notifier.notify("STOPPING=1")
        self.services.stop()
        if self.learner is not None:
            self.learner.stop()  # saves the rightsizing history
        with self.lock:
            if self.backend is not None:
                self.journal.stopped(self.backend.stop())
            if self.sampler is not None:
                self.sampler.close()
            self.inventory.stop_events()
        if self._instance_lock is not None:
            self._instance_lock.release()
            self._instance_lock = None

    # ---- decide and act -----------------------------------------------------------------------

    def replan(self, trigger: str, changes: Optional[List[Any]] = None) -> None:
        """Match and plan again. After process events (`changes`) only the workloads they changed are planned
        (plan_delta) and the threads new or moved treated, unless CPUs or a tier move; else the whole plan."""
        assert self.view is not None and self.matcher is not None and self.backend is not None
        snapshot = self.inventory.snapshot()
        wanted = self.ranked.pids()  # recent runtimes matter only for processes of profiles with a `busiest` group
        if wanted:
            self.inventory.refresh_runtime(wanted)
        used: List[Sizing] = []

        def sizing(workloads) -> Sizing:
            used.append(self._sizing(workloads))
            return used[-1]

        match, layer_plan = decide(self.view, self.matcher, snapshot.processes, sizing, self.plan_memo,
                                   self.plan if changes is not None else None, snapshot.generation,
                                   self.inventory.changed_since(self.matcher.generation))  # compared: only these
        self._sizes = used[-1].sizes() if used else self._sizes  # a delta (plan_delta) is not sized again
        unchanged = changes is not None and (layer_plan is self.plan or layer_plan == self.plan)
        self.match, self.plan = match, layer_plan
        self.ranked.update(match, self.view.profiles.active)
        fresh = _new_threads(changes, snapshot) if changes is not None else None
        try:
            if unchanged:
                if not fresh:
                    return
                result = self.backend.on_new_threads(fresh)
            else:  # told the new threads (events), the backend may treat only those and the moved
                result = self.backend.apply(layer_plan, snapshot.threads, fresh)
                if self.sampler is not None:
                    self.sampler.update_membership(layer_plan)
        finally:
            if changes is not None:
                self.backend.forget_threads(_ended_threads(changes), snapshot.threads)
        self.journal.applied(match, layer_plan, result, trigger)
        self.last_apply = result
        self.replans += 1
        self.metrics.actions.update(result)
        for error in layer_plan.errors:
            log.error("plan: %s", error)
        log.debug("replanned (%s): %d workloads, %d layers", trigger, len(match.workloads), len(layer_plan.layers))

    def _sizing(self, workloads) -> Sizing:
        """Exclusive groups sized by what their threads were measured to use ([rightsizing])."""
        if self.learner is None or not self.learner.settings.rightsizing:
            return NO_SIZING
        sized = sized_workloads(workloads, all_profiles(self.view, self.matcher))
        demand = self.learner.group_demands(sized)
        return Sizing(demand, self._sizes, member_counts(sized, demand))

    def replan_if_measured(self) -> None:
        """At each observation sample: replan where an exclusive group's measured use asks for
        another size (decide/sizing.py's hysteresis keeps it from flapping), or read the order of
        `busiest` groups' threads again (it stood from the last process event or scan: for a
        server idle when planned, whichever threads ranked first); a new order moves only those."""
        if self.plan is None or self.match is None or self.view is None:
            return
        if self._sizing(self.match.workloads).sizes() != self._sizes:
            self.replan("resize")
        elif self.ranked.pids():
            self.replan("busiest re-ranked", [])

    def reload(self, trigger: str) -> ReloadView:
        """Validate everything anew; adopt it only when it is whole, else keep the last good set.
        A new [http] address is bound before anything is adopted: if it cannot be had, the
        reload is refused and the old listener keeps serving. Settings that only a start takes
        (reload.RESTART_ONLY) refuse the reload too."""
        assert self.backend is not None and self.sampler is not None
        self.notifier.notify("RELOADING=1")
        try:
            return self._reload(trigger)
        finally:
            self.notifier.notify("READY=1")
            self._notify_status()

    def _reload(self, trigger: str) -> ReloadView:
        assert self.backend is not None and self.sampler is not None
        view, problems = self.loader.attempt()
        if view is not None and not problems:
            problems = restart_only_changes(self.config, view.config) or self._move_http(view.config)
        if problems:
            for problem in problems:
                log.error("reload (%s) refused, the running configuration stays: %s", trigger, problem)
            self.journal.reloaded(False, self.generation, trigger, problems=problems)
            result = ReloadView(False, self.generation, time.time(), trigger, problems,
                                f"kept generation {self.generation}")
        else:
            assert view is not None
            old = self.view
            self.view = view
            self.generation += 1
            self.matcher = self._make_matcher(view)
            if self.backend.retry():  # a reload is the operator's way to leave scx safe mode
                log.info("reload (%s): scx backend leaves safe mode", trigger)
            if old is not None and old.shape != view.shape:
                log.info("machine shape changed: %s", view.shape.describe())
                self.sampler.reshape(view.shape)
            self.sampler.latency_bound_s = view.config.lint_runqueue_latency_p99_ms / 1e3
            if self.learner is not None:  # window and margin at once; the history's file and shape at the next start
                self.learner.settings = view.config.learner
            self.sampler.telemetry.set_bpf(view.config.telemetry_bpf)
            self.replan(f"reload ({trigger})")
            result = ReloadView(True, self.generation, time.time(), trigger, [], summary_of(view))
            self.journal.reloaded(True, self.generation, trigger, result.summary)
        self.last_reload = result
        return result

    def _move_http(self, config: DaemonConfig) -> List[str]:
        """Serve HTTP where the new configuration says; a problem when it cannot be done."""
        try:
            self.services.move_http(config.http_listen, config.http_port)
        except OSError as exc:
            http = self.services.http
            stays = f"http://{http.address} keeps serving" if http is not None else "HTTP stays off"
            return [f"{config.source}: [http] {exc.strerror or exc}; {stays}"]
        return []

    def observe(self, wait: bool = False) -> None:
        """One observation sample (observe.sampler): observer, linter, metrics; on the sampler's thread unless `wait`."""
        if self.sampler is None or self.plan is None:
            return
        assert self.backend is not None
        take = self.sampler.sample if wait else self.sampler.sample_in_background
        take(self.plan, self.inventory.snapshot().processes, self.match, self.backend_status(),
             self.backend.layer_cpus())
        self._notify_status()

    # ---- what others see (status_report) ------------------------------------------------------

    def status(self) -> Optional[Status]:
        """The typed status (None until started), built under the lock."""
        return status_report.build_status(self)

    def observe_json(self) -> dict:
        with self.lock:
            if self.sampler is not None and self.sampler.observation is None:
                self.observe(wait=True)
            return status_report.observe_json(self)

    def backend_status(self) -> BackendStatus:
        with self.lock:
            return self.backend.status() if self.backend is not None else BackendStatus(carried_by="-")

    def _notify_status(self) -> None:
        self.notifier.notify(f"STATUS={status_report.status_line(self)}")


def _tracked(daemon: Daemon):
    """For the learner's thread, read under the lock: the workloads old enough to track, the plan, the profiles."""
    with daemon.lock:
        assert daemon.view is not None
        processes = daemon.inventory.snapshot().processes
        return settled(daemon.match.workloads, processes, procfs.boot_ticks()), daemon.plan, daemon.view.profiles.active


def _first_view(loader: ViewLoader) -> HostView:
    try:
        view = loader.load()
    except ConfigError as exc:
        raise StartupError("\n".join(f"error: {p}" for p in exc.problems)) from None
    except ShapeError as exc:
        raise StartupError(f"error: cannot read the machine shape: {exc}") from None
    for problem in view.problems:
        log.error("profile not loaded: %s", problem)
    return view


def _lock_instance(state_dir: str) -> InstanceLock:
    """The state directory, made if missing, locked for this instance; StartupError if another holds it."""
    try:
        os.makedirs(state_dir, mode=0o755, exist_ok=True)
        lock = InstanceLock(state_dir)
        lock.acquire()
    except AlreadyRunning as exc:
        raise StartupError(f"error: {exc}") from None
    except OSError as exc:
        raise StartupError(f"error: cannot use the state directory {state_dir}: {exc.strerror or exc}") from None
    return lock


def describe_error(exc: BaseException) -> str:
    """One line for an unexpected error: an OSError's text and file, else the exception's own."""
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.strerror} ({exc.filename})" if exc.filename else exc.strerror
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _cleanup_stale_traces() -> None:
    try:
        removed = cleanup_stale_instances()
        if removed:
            log.info("removed %d trace instance(s) left by a dead capture", len(removed))
    except OSError as exc:
        log.warning("could not check for leftover trace instances: %s", exc)


def _ended_threads(changes) -> List[int]:
    """Thread ids these changes ended, or replaced (a reused id is a new thread under the old id).
    A whole process that ended names its leader's id: its other threads ended one by one before."""
    return [change.pid if change.tid is None else change.tid
            for change in changes if change.kind in ("exit", "reused")]


def _new_threads(changes, snapshot) -> List[Any]:
    """Threads that appeared with these changes (a new process brings all of its threads)."""
    out = {}
    for change in changes:
        if change.kind == "new_thread" and change.tid is not None:
            thread = snapshot.thread(change.tid)
            if thread is not None:
                out[thread.tid] = thread
        elif change.kind in ("new_process", "reused", "exec"):
            proc = snapshot.process(change.pid)
            if proc is not None:
                out.update(proc.threads)
    return list(out.values())
