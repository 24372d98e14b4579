"""scx_layered's stats reply as temperd reads it (typed after its stats.rs) and shows it."""

from temperd.backends.scx.stats import LayerStats, SysStats, describe, layer_cpus, summarize_stats
from temperd.backends.scx.status import ScxStatus
from temperd.control.status import GapView, LayerScxView, SupervisorView

# A reply shaped like scx_layered 1.1.2's (fields trimmed; one it does not have yet).
REPLY = {
    "at": 12.5, "busy": 61.0, "util": 244.0, "total": 9000, "lo_fb": 3.5, "lo_fb_util": 180.5, "antistall": 0,
    "some_future_field": {"x": 1},
    "layers": {
        "redis.event-loop": {"util": 24.7, "tasks": 1, "cur_nr_cpus": 2, "cpus": [0b0011], "util_protected_frac": 0.0,
                             "l_runq_lat_hist": [1, 2, 3]},
        "spinners.tier": {"util": 180.5, "tasks": 4, "cur_nr_cpus": 0, "cpus": [0]},
        "rest": {"util": 37.2, "tasks": 39, "cur_nr_cpus": 2, "cpus": [0b1100]},
    },
}


def test_the_reply_becomes_typed_stats():
    stats = SysStats.from_json(REPLY)
    assert stats.busy == 61.0 and stats.lo_fb_util == 180.5 and stats.antistall == 0
    assert stats.layers["redis.event-loop"] == LayerStats(util=24.7, tasks=1, cur_nr_cpus=2, util_protected_frac=0.0,
                                                          cpus=frozenset({0, 1}))
    assert layer_cpus(stats) == {"redis.event-loop": frozenset({0, 1}), "spinners.tier": frozenset(),
                                 "rest": frozenset({2, 3})}
    # the numbers behind /metrics: scx_layered's own names, no lists, no masks
    assert summarize_stats(stats)["layers"]["redis.event-loop"] == {"util": 24.7, "tasks": 1, "cur_nr_cpus": 2,
                                                                    "util_protected_frac": 0.0}
    assert "some_future_field" not in summarize_stats(stats)["system"]


def test_each_layer_described_as_status_shows_it():
    stats = SysStats.from_json(REPLY)
    assert describe(stats.layers["redis.event-loop"]) == "25% of a CPU on 0-1"
    assert describe(stats.layers["spinners.tier"]) == "180% of a CPU, no CPUs of its own"
    assert describe(stats.layers["rest"]) == "37% of a CPU on 2-3"
    assert describe(LayerStats(util=5.0, cpus=frozenset({0, 2, 3, 5}))) == "5% of a CPU on 0,2-3,5"
    assert describe(None) == "-" and describe(LayerStats()) == "-"


def test_layer_view_puts_the_stats_beside_a_plan_layer():
    stats = SysStats.from_json(REPLY)
    summary = summarize_stats(stats)
    status = ScxStatus(fallback_reason=None, safe_mode=False, safe_mode_reason=None, render_notes=(), render_problems=(),
                       supervisor=_idle_supervisor(), system_stats=summary["system"], layer_stats=summary["layers"],
                       layer_cpus={n: tuple(sorted(c)) for n, c in layer_cpus(stats).items()},
                       layer_text={n: describe(l) for n, l in stats.layers.items()})
    assert status.layer_view("rest") == LayerScxView(util_pct=37.2, tasks=39, cpus_held=2, cpus=[2, 3],
                                                     text="37% of a CPU on 2-3")
    assert status.layer_view("not.there") is None
    assert status.view().scx_stats.layers["redis.event-loop"]["cpus"] == [0, 1]


def _idle_supervisor() -> SupervisorView:
    return SupervisorView(
        state="running", pid=1, binary="scx_layered", args=[], config_path="c", log_path="l", stats_socket="s",
        uptime_s=1.0, pending_change=False, next_restart_in_s=None, safe_mode=False, safe_mode_reason=None,
        crashes_in_window=0, last_exit=None, default_scheduler_gap_s=GapView(None, 0.0),
        stats_age_s=0.5, stats_error=None, starts=1, restarts=0, crash_restarts=0, crashes=0, outside_stops=0,
        coalesced_changes=0, refusals=0, stats_reads=3, stats_errors=0, safe_mode_entries=0)
