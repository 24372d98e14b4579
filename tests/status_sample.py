"""A running daemon's state made of the real typed parts (BackendStatus with scx_layered's,
ReloadView, ApplyResult, InventoryView, OverheadView, LintReport, a plan), without a daemon: what
status_report.build_status reads, for the typed status's tests."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

from temperd.backends.result import ApplyResult
from temperd.backends.select import BackendChoice
from temperd.backends.status import BackendStatus
from temperd.config.errors import ConfigProblem
from temperd.control.status import (ExitView, GapView, InventoryView, LayerScxView, LearnerView, ReloadView,
                                    ScxStatsView, ScxView, SupervisorView)
from temperd.daemon import status_report
from temperd.observe.linter import LintReport, Violation
from temperd.control.status import OverheadView
from temperd.plan import CONFINED, EXCLUSIVE, OPEN, OWNED, YIELD, Layer, LayerPlan, MemberSelector


def supervisor() -> SupervisorView:
    return SupervisorView(
        state="running", pid=4242, binary="/usr/bin/scx_layered", args=["--stats", "1"], config_path="cfg.json",
        log_path="scx.log", stats_socket="stats.sock", uptime_s=12.5, pending_change=False, next_restart_in_s=None,
        safe_mode=False, safe_mode_reason=None, crashes_in_window=1,
        last_exit=ExitView(code=-9, requested=False, reason="killed by SIGKILL", wall_time=1700000000.0),
        default_scheduler_gap_s=GapView(0.25, 0.75), stats_age_s=0.5, stats_error=None,
        starts=3, restarts=2, crash_restarts=1, crashes=1, outside_stops=0, coalesced_changes=4, refusals=0,
        stats_reads=17, stats_errors=0, safe_mode_entries=0)


def backend(scx: bool = True) -> BackendStatus:
    if not scx:
        return BackendStatus(carried_by="native", drift={"nice": 2})
    status = ScxView(fallback_reason=None, safe_mode=False, safe_mode_reason=None, render_notes=["one note"],
                     render_problems=[], scx_layered=supervisor(),
                     scx_stats=ScxStatsView({"busy": 42.5},
                                            {"web.hot": {"util": 150.0, "tasks": 4, "cur_nr_cpus": 2, "cpus": [2, 3]},
                                             "catchall": {"util": 20.0, "tasks": 90, "cur_nr_cpus": 1, "cpus": []}}))
    layers = {"web.hot": LayerScxView(150.0, 4, 2, [2, 3], "1.50 CPUs on 2,3"),
              "catchall": LayerScxView(20.0, 90, 1, [], "-")}
    return BackendStatus(carried_by="scx", drift={"nice": 2, "affinity": 1}, scx=status, scx_layers=layers)

def plan() -> LayerPlan:
    return LayerPlan(layers=(
        Layer(name="web.hot", kind=CONFINED, treatment=EXCLUSIVE, tier="critical", workload="web", group="hot",
              selector=MemberSelector(tids=(101, 102)), cpus=(2, 3), ownership=OWNED),
        Layer(name="web.rest", kind=OPEN, treatment=YIELD, tier="critical", workload="web", group="rest",
              selector=MemberSelector(tids=(100,)), policy="idle")), reserve_cpus=(0,))


def daemon(scx: bool = True) -> SimpleNamespace:
    workload = SimpleNamespace(key="unit:web.service", profile_id="web", tier="critical", budget=2.5,
                               source="fingerprint", reason="process name web", pids=(100,),
                               threads=[SimpleNamespace(group="hot"), SimpleNamespace(group="hot"),
                                        SimpleNamespace(group=None)])
    other = SimpleNamespace(key="unit:batch.service", profile_id=None, tier="batch", budget=None, source="binding",
                            reason="binding batch", pids=(200, 201), threads=[SimpleNamespace(group="rest")])
    profiles = SimpleNamespace(active={"web": object(), "redis": object()},
                               problems=[ConfigProblem("profiles.d/bad.toml", ("thread_groups", 0, "treatment"),
                                                       "expected one of exclusive, latency, yield", 7)])
    sampler = SimpleNamespace(
        observation=SimpleNamespace(overhead=OverheadView(sample_cpu_s=0.012, observe_cpu_ratio=0.003,
                                                      daemon_cpu_ratio=0.021, window_s=5.0)),
        lint=LintReport((Violation("smt_collision", "web.hot", 101, "sibling busy"),
                         Violation("smt_collision", "web.hot", 102, "sibling busy"),
                         Violation("layer_mismatch", "web.rest", 100, "policy other"))),
        telemetry=SimpleNamespace(describe=lambda: "schedstat (bcc: not installed)"))
    stats = InventoryView(events_active=True, events_received=1234, events_lost=1, vanished=5, reconciles=3,
                          last_reconcile_duration_s=0.05, last_reconcile_cpu_s=0.04, processes=12, threads=340,
                          last_event_lag_s=0.001, max_event_lag_s=0.02, untracked=300, untracked_seen=900,
                          bounded=0, event_filter="exec, exit")
    status = backend(scx)
    choice = BackendChoice("auto", "scx" if scx else "native", "scx_layered found" if scx else "no sched_ext")
    watch = SimpleNamespace(describe=lambda: LearnerView(2, 40, 0.5, 0.01, "history.json", 2048,
                                                         "history.json: 2 workload(s)"))
    return SimpleNamespace(
        lock=contextlib.nullcontext(), state="running", started_at=0.0, config_dir="/etc/temper", generation=3,
        view=SimpleNamespace(profiles=profiles, shape=SimpleNamespace(describe=lambda: "4 CPUs, 2 cores")),
        sampler=sampler, services=SimpleNamespace(http=SimpleNamespace(address="127.0.0.1:9464")),
        backend_choice=choice, backend_status=lambda: status,
        last_reload=ReloadView(False, 3, 1700000100.0, "SIGHUP", ["bad.toml: treatment"], "kept generation 3"),
        match=SimpleNamespace(workloads=[workload, other]), plan=plan(),
        last_apply=ApplyResult(applied={"affinity": 3}, failed={"nice": 1}, notes=["a note"]),
        inventory=SimpleNamespace(stats=stats, gate=SimpleNamespace(describe="name, executable")),
        replans=7, event_passes=150, event_cpu_s=0.37, learner=watch)


def status(scx: bool = True):
    built = status_report.build_status(daemon(scx))
    assert built is not None
    return built
