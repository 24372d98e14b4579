"""temperd: one process that loads config and profiles, keeps the inventory, plans, applies through
the backend, observes and serves.

Threads: the main loop owns the inventory and the backend and does all replanning; the control
socket and HTTP threads read the published status and may ask for a reload, all under one lock.
"""

from __future__ import annotations

import dataclasses
import fcntl
import logging
import os
import select
import signal
import threading
import time
from typing import Any, Dict, List, Optional

from temperd import __version__
from temperd.backends import Backend
from temperd.backends.select import BackendChoice, make_backend
from temperd.config.daemon_config import DEFAULT_CONFIG_DIR
from temperd.daemon.control import ControlError, ControlServer
from temperd.decide.hostview import HostView, decide, load_host_view, make_matcher
from temperd.config.errors import ConfigError, ConfigProblem
from temperd.observe.http import HttpApi
from temperd.sources.inventory import Inventory
from temperd.observe.linter import RateLimitedLog, lint
from temperd.observe.metrics import Metrics
from temperd.decide.matcher import Matcher, MatchResult
from temperd.observe.observer import Observer
from temperd.plan import LayerPlan
from temperd.sources.shape import ShapeError
from temperd.trace.capture import cleanup_stale_instances
from temperd.daemon.trace_commands import trace_handler
from temperd.sources.watch import ConfigWatcher, CpuHotplugWatcher

log = logging.getLogger("temperd")

OBSERVE_INTERVAL_S = 5.0


class StartupError(Exception):
    """temperd cannot start; the message says why."""


@dataclasses.dataclass
class ReloadResult:
    ok: bool
    generation: int
    at: float
    trigger: str
    problems: List[str]
    summary: str

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


class Notifier:
    """sd_notify when run by systemd (NOTIFY_SOCKET set); silent otherwise."""

    def __init__(self) -> None:
        self._notifier = None
        if os.environ.get("NOTIFY_SOCKET"):
            import sdnotify

            self._notifier = sdnotify.SystemdNotifier()
        usec = int(os.environ.get("WATCHDOG_USEC", "0") or 0)
        self.watchdog_interval_s = usec / 2e6 if usec else None

    def notify(self, text: str) -> None:
        if self._notifier is not None:
            self._notifier.notify(text)


class Daemon:
    def __init__(self, config_dir: str = DEFAULT_CONFIG_DIR, sysfs_root: str = "/sys", *,
                 state_dir: Optional[str] = None, http_port: Optional[int] = None,
                 control_socket: Optional[str] = None, observe_interval_s: float = OBSERVE_INTERVAL_S):
        self.config_dir = config_dir
        self.sysfs_root = sysfs_root
        self._overrides = {"state_dir": state_dir, "http_port": http_port, "control_socket": control_socket}
        self.observe_interval_s = observe_interval_s
        self.lock = threading.RLock()
        self.notifier = Notifier()
        self.started_at = time.time()
        self.state = "starting"
        self.generation = 0
        self.view: Optional[HostView] = None
        self.matcher: Optional[Matcher] = None
        self.match = MatchResult()
        self.plan: Optional[LayerPlan] = None
        self.last_reload: Optional[ReloadResult] = None
        self.backend_choice: Optional[BackendChoice] = None
        self.backend: Optional[Backend] = None
        self.last_apply: Optional[Any] = None
        self.observation: Optional[Any] = None
        self.violations: List[Any] = []
        self.inventory = Inventory()
        self._stop = threading.Event()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._pending: Dict[str, str] = {}  # request kind -> trigger ("reload" -> "SIGHUP", ...)
        self._lockfile: Optional[int] = None
        self._services: List[Any] = []
        self.metrics = None
        self.observer = None
        self.http = None
        self.replans = 0

    # ---- configuration ------------------------------------------------------------------------

    def _apply_overrides(self, view: HostView) -> HostView:
        changes = {k: v for k, v in self._overrides.items() if v is not None}
        if changes:
            view = dataclasses.replace(view, config=dataclasses.replace(view.config, **changes))
        return view

    def _load_view(self) -> HostView:
        return self._apply_overrides(load_host_view(self.config_dir, self.sysfs_root))

    @property
    def config(self):
        assert self.view is not None
        return self.view.config

    # ---- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        try:
            view = self._load_view()
        except ConfigError as exc:
            raise StartupError("\n".join(f"error: {p}" for p in exc.problems)) from None
        except ShapeError as exc:
            raise StartupError(f"error: cannot read the machine shape: {exc}") from None
        for problem in view.problems:
            log.error("profile not loaded: %s", problem)
        self.view = view
        self.generation = 1
        self.last_reload = ReloadResult(not view.problems, 1, time.time(), "start",
                                        [str(p) for p in view.problems], self._view_summary(view))
        os.makedirs(self.config.state_dir, mode=0o755, exist_ok=True)
        self._take_instance_lock()
        self._cleanup_stale_traces()
        self.backend_choice, self.backend = make_backend(self.config, self.sysfs_root, view.shape)
        log.info("backend %s: %s", self.backend_choice.active, self.backend_choice.reason)
        if hasattr(self.backend, "on_fallback"):  # scx: safe mode or a refusal switches to native on the main loop
            self.backend.on_fallback = lambda reason: self.request("replan", f"scx fallback: {reason}")
        self.backend.recover()
        self.matcher = make_matcher(view)
        if not self.inventory.start():
            log.warning("process events unavailable (%s): scanning /proc every %.0f s instead",
                        self.inventory.unavailable_reason, self.config.scan_interval(False))
        self._start_observation()
        self.metrics.record_reload(self.last_reload.ok, self.generation, self.last_reload.at, len(self.last_reload.problems))
        self.replan("start")
        self._start_services()
        self.state = "running"
        self.notifier.notify("READY=1")
        self._notify_status()
        log.info("temperd %s running: %s", __version__, self.status_line())

    def _take_instance_lock(self) -> None:
        path = os.path.join(self.config.state_dir, "temperd.lock")
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StartupError(f"error: another temperd is running (lock {path} is held)") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._lockfile = fd

    def _cleanup_stale_traces(self) -> None:
        try:
            removed = cleanup_stale_instances()
            if removed:
                log.info("removed %d trace instance(s) left by a dead capture", len(removed))
        except OSError as exc:
            log.warning("could not check for leftover trace instances: %s", exc)

    def _start_observation(self) -> None:

        assert self.view is not None
        self.metrics = Metrics()
        self.observer = Observer(self.view.shape)
        self.lint_log = RateLimitedLog()

    def _start_services(self) -> None:
        config = self.config
        handlers = {"status": self._cmd_status, "reload": self._cmd_reload, "plan": self._cmd_plan,
                    "explain": self._cmd_explain, "observe": lambda req, progress: {"observe": self.observe_json()}}
        handlers.update(self._extra_handlers())
        control = ControlServer(config.control_socket, handlers, config.control_group)
        control.start()
        self._services.append(control)
        if config.http_port:
            self.http = HttpApi(config.http_listen, config.http_port, self.metrics_text, self.observe_json)
            self.http.start()
            self._services.append(self.http)
            log.info("serving /metrics and /observe on http://%s:%d", config.http_listen, self.http.port)
        watcher = ConfigWatcher(self.config_dir, config.profile_dir, lambda: self.request("reload", "file change"))
        watcher.start()
        self._services.append(watcher)
        hotplug = CpuHotplugWatcher(lambda: self.request("reload", "CPU hotplug"))
        hotplug.start()
        self._services.append(hotplug)

    def _extra_handlers(self) -> Dict[str, Any]:
        return {"trace": trace_handler}

    def request(self, kind: str, trigger: str) -> None:
        """From signal handlers and other threads: ask the main loop to do something."""
        self._pending[kind] = trigger
        try:
            os.write(self._wake_w, b"x")
        except BlockingIOError:
            pass

    def stop(self) -> None:
        self.state = "stopping"
        self.notifier.notify("STOPPING=1")
        for service in reversed(self._services):
            try:
                service.stop()
            except Exception as exc:  # keep going: restoring threads matters more
                log.warning("stopping %s: %s", type(service).__name__, exc)
        self._services.clear()
        with self.lock:
            if self.backend is not None:
                self.backend.stop()
                log.info("stopped: every changed thread restored")
        self.inventory.stop_events()
        if self._lockfile is not None:
            os.close(self._lockfile)
            self._lockfile = None

    # ---- the main loop ----------------------------------------------------------------------

    def run(self) -> None:
        next_reconcile = time.monotonic() + self.config.scan_interval(self.inventory.events_active)
        next_observe = time.monotonic() + min(1.0, self.observe_interval_s)
        watchdog_every = self.notifier.watchdog_interval_s or 10.0
        next_watchdog = time.monotonic()
        while not self._stop.is_set():
            now = time.monotonic()
            deadlines = [next_reconcile, next_observe, next_watchdog]
            timeout = max(0.0, min(deadlines) - now)
            inv_timeout = self.inventory.poll_timeout()
            if inv_timeout is not None:
                timeout = min(timeout, inv_timeout)
            fds = [self._wake_r] + ([self.inventory.fileno()] if self.inventory.events_active else [])
            try:
                ready, _, _ = select.select(fds, [], [], timeout)
            except InterruptedError:
                ready = []
            if self._wake_r in ready:
                try:
                    while os.read(self._wake_r, 4096):
                        pass
                except BlockingIOError:
                    pass
            with self.lock:
                changes = self.inventory.handle_events() if self.inventory.events_active else []
                pending, self._pending = self._pending, {}
                if "stop" in pending:
                    break
                if "reload" in pending:
                    self.reload(pending["reload"])
                elif "replan" in pending:
                    self.replan(pending["replan"])  # a whole apply: the backend's situation changed
                elif changes:
                    self.replan("events", changes)
                now = time.monotonic()
                if now >= next_reconcile or self.inventory.needs_reconcile:
                    summary = self.inventory.reconcile()
                    next_reconcile = now + self.config.scan_interval(self.inventory.events_active)
                    if summary.changes:
                        self.replan("reconcile")
                if now >= next_observe:
                    self.observe()
                    next_observe = now + self.observe_interval_s
            if now >= next_watchdog:
                self.notifier.notify("WATCHDOG=1")
                next_watchdog = now + watchdog_every

    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGHUP, lambda *_: self.request("reload", "SIGHUP"))
        signal.signal(signal.SIGTERM, lambda *_: self.request("stop", "SIGTERM"))
        signal.signal(signal.SIGINT, lambda *_: self.request("stop", "SIGINT"))

    # ---- decide and act -----------------------------------------------------------------------

    def replan(self, trigger: str, changes: Optional[List[Any]] = None) -> None:
        """Match and plan again; apply the whole plan when it changed, else only treat the threads
        that are new (a whole-host apply costs milliseconds per hundred threads)."""
        assert self.view is not None and self.matcher is not None
        snapshot = self.inventory.snapshot()
        self._refresh_busiest(snapshot)
        match, layer_plan = decide(self.view, self.matcher, snapshot.processes.values())
        unchanged = changes is not None and layer_plan == self.plan
        self.match, self.plan = match, layer_plan
        if unchanged:
            fresh = _new_threads(changes, snapshot)
            if not fresh:
                return
            result = self.backend.on_new_threads(fresh)
        else:
            result = self.backend.apply(layer_plan, snapshot.threads.values())
        self.last_apply = result
        self.replans += 1
        if self.metrics is not None:
            self.metrics.record_apply(self.last_apply)
        for error in layer_plan.errors:
            log.error("plan: %s", error)
        log.debug("replanned (%s): %d workloads, %d layers", trigger, len(match.workloads), len(layer_plan.layers))

    def _refresh_busiest(self, snapshot) -> None:
        """Recent runtimes matter only for processes of profiles with a `busiest` group."""
        if not self.view:
            return
        wanted = []
        for workload in self.match.workloads:
            profile = self.view.profiles.active.get(workload.profile_id or "")
            if profile and any(g.busiest for g in profile.thread_groups):
                wanted.extend(workload.pids)
        if wanted:
            self.inventory.refresh_runtime(wanted)

    def reload(self, trigger: str) -> ReloadResult:
        """Validate everything anew; adopt it only when it is whole, else keep the last good set."""
        self.notifier.notify("RELOADING=1")
        try:
            view = self._load_view()
            problems = [str(p) for p in view.problems]
        except ConfigError as exc:
            view, problems = None, [str(p) for p in exc.problems]
        except ShapeError as exc:
            view, problems = None, [f"machine shape: {exc}"]
        if problems:
            for problem in problems:
                log.error("reload (%s) refused, the running configuration stays: %s", trigger, problem)
            result = ReloadResult(False, self.generation, time.time(), trigger, problems,
                                  f"kept generation {self.generation}")
        else:
            assert view is not None
            old = self.view
            self.view = view
            self.generation += 1
            self.matcher = make_matcher(view)
            if self.backend.retry():  # a reload is the operator's way to leave scx safe mode
                log.info("reload (%s): scx backend leaves safe mode", trigger)
            if old is not None and old.shape != view.shape:
                log.info("machine shape changed: %s", view.shape.describe())
                self.observer = Observer(view.shape)
            self.replan(f"reload ({trigger})")
            result = ReloadResult(True, self.generation, time.time(), trigger, [], self._view_summary(view))
            log.info("reloaded (%s): generation %d, %s", trigger, self.generation, result.summary)
        self.last_reload = result
        if self.metrics is not None:
            self.metrics.record_reload(result.ok, self.generation, result.at, len(result.problems))
        self.notifier.notify("READY=1")
        self._notify_status()
        return result

    @staticmethod
    def _view_summary(view: HostView) -> str:
        return f"{len(view.profiles.active)} profiles, {len(view.config.bindings)} bindings"

    def observe(self) -> None:
        if self.observer is None or self.plan is None:
            return
        snapshot = self.inventory.snapshot()
        self.observation = self.observer.sample(self.plan, snapshot.processes, self.match, time.time())
        backend = self.backend_status()  # once per sample: the scx backend's status reads its supervisor
        carried_by = backend.get("carried_by", "-")
        self.violations = lint(self.plan, self.observation, self.view.shape, self.match,
                               check_treatment=carried_by == "native", confined_cpus=self.backend.layer_cpus())
        self.lint_log.report(self.violations)
        if self.metrics is not None:
            self.metrics.record_observation(self.observation)
            self.metrics.set_lint(self.violations)
            self.metrics.record_inventory(self.inventory.stats)
            self.metrics.set_workloads(self.match.workloads)
            self.metrics.set_backend(carried_by, backend.get("safe_mode", False))
            if "scx_layered" in backend:
                self.metrics.record_scx(backend["scx_layered"], backend.get("scx_stats") or {})
        self._notify_status()

    # ---- what others see ----------------------------------------------------------------------

    def status_line(self) -> str:
        workloads = len(self.match.workloads)
        layers = len(self.plan.layers) if self.plan else 0
        return (f"{self.state}; backend {self.carried_by()}; "
                f"generation {self.generation}; {workloads} workloads, {layers} layers; "
                f"{len(self.violations)} lint violations")

    def _notify_status(self) -> None:
        self.notifier.notify(f"STATUS={self.status_line()}")

    def carried_by(self) -> str:
        """The backend that carries the plan now: the chosen one, or native while scx has fallen back."""
        return self.backend_status().get("carried_by", "-")

    def backend_status(self) -> dict:
        return self.backend.status() if self.backend is not None else {}

    def status(self) -> dict:
        with self.lock:
            view = self.view
            assert view is not None
            pset = view.profiles
            observation = self.observation
            return {
                "version": __version__,
                "state": self.state,
                "pid": os.getpid(),
                "uptime_s": round(time.time() - self.started_at, 1),
                "config_dir": self.config_dir,
                "generation": self.generation,
                "last_reload": self.last_reload.as_dict() if self.last_reload else None,
                "backend": {**dataclasses.asdict(self.backend_choice), **self.backend_status()},
                "machine_shape": view.shape.describe(),
                "profiles": {"loaded": sorted(pset.active), "failed": [p.as_dict() for p in pset.problems]},
                "workloads": [workload_summary(w) for w in self.match.workloads],
                "layers": [{"name": l.name, "kind": l.kind, "treatment": l.treatment, "cpus": list(l.cpus),
                            "members": len(l.selector.tids)} for l in (self.plan.layers if self.plan else ())],
                "last_apply": _as_dict(self.last_apply),
                "lint": lint_summary(self.violations),
                "overhead": getattr(observation, "overhead", None) and dataclasses.asdict(observation.overhead),
                "inventory": dataclasses.asdict(self.inventory.stats),
                "replans": self.replans,
                "http": f"http://{view.config.http_listen}:{self.http.port}" if self.http else None,
            }

    def observe_json(self) -> dict:
        with self.lock:
            if self.observation is None:
                self.observe()
            data = self.observation.to_json() if self.observation is not None else {}
            data["lint"] = [dataclasses.asdict(v) for v in self.violations]
            data["backend"] = ({**dataclasses.asdict(self.backend_choice), **self.backend_status()}
                               if self.backend_choice else None)
            return data

    def metrics_text(self) -> bytes:
        return self.metrics.exposition() if self.metrics is not None else b""

    # ---- control commands ---------------------------------------------------------------------

    def _cmd_status(self, request: dict, progress) -> dict:
        return {"status": self.status()}

    def _cmd_reload(self, request: dict, progress) -> dict:
        with self.lock:
            return {"reload": self.reload("temperctl reload").as_dict()}

    def _cmd_plan(self, request: dict, progress) -> dict:
        with self.lock:
            assert self.view is not None
            return {"machine_shape": self.view.shape.describe(),
                    "workloads": [dataclasses.asdict(w) for w in self.match.workloads],
                    "plan": dataclasses.asdict(self.plan) if self.plan else None}

    def _cmd_explain(self, request: dict, progress) -> dict:
        try:
            task = int(request.get("id"))
        except (TypeError, ValueError):
            raise ControlError("explain needs an integer id (a PID or TID)")
        with self.lock:
            thread = self.inventory.thread(task)
            proc = self.inventory.process(task) or (self.inventory.process(thread.pid) if thread else None)
            if proc is None:
                raise ControlError(f"no process or thread {task}")
            workload = self.match.workload_of(proc.pid)
            return {"pid": proc.pid, "tid": task if proc.pid != task else None, "process": proc.name,
                    "workload": dataclasses.asdict(workload) if workload else None,
                    "why_not": None if workload else self.matcher.explain_unmatched(proc)}


def _new_threads(changes, snapshot) -> List[Any]:
    """Threads that appeared with these changes (a new process brings all of its threads)."""
    out: Dict[int, Any] = {}
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


def workload_summary(workload) -> dict:
    groups: Dict[str, int] = {}
    for thread in workload.threads:
        groups[thread.group or "-"] = groups.get(thread.group or "-", 0) + 1
    return {"key": workload.key, "profile": workload.profile_id, "tier": workload.tier, "budget": workload.budget,
            "source": workload.source, "reason": workload.reason, "pids": list(workload.pids),
            "threads": len(workload.threads), "groups": groups}


def lint_summary(violations) -> dict:
    counts: Dict[str, int] = {}
    for violation in violations:
        counts[violation.invariant] = counts.get(violation.invariant, 0) + 1
    return {"total": len(violations), "by_invariant": counts}


def _as_dict(value) -> Optional[dict]:
    if value is None:
        return None
    if dataclasses.is_dataclass(value):
        return dataclasses.asdict(value)
    return dict(value) if isinstance(value, dict) else {"value": str(value)}


__all__ = ["Daemon", "StartupError", "ConfigProblem"]
