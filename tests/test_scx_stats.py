"""scx_layered's stats reply as temperd reads it (typed after its stats.rs) and shows it."""

from temperd.backends.scx.stats import LayerStats, SysStats, describe, layer_cpus, scx_layer_views, stats_view
from temperd.control.status import LayerScxView

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
    assert stats_view(stats).layers["redis.event-loop"] == {"util": 24.7, "tasks": 1, "cur_nr_cpus": 2,
                                                            "util_protected_frac": 0.0, "cpus": [0, 1]}
    assert "some_future_field" not in stats_view(stats).system


def test_each_layer_described_as_status_shows_it():
    stats = SysStats.from_json(REPLY)
    assert describe(stats.layers["redis.event-loop"]) == "25% of a CPU on 0-1"
    assert describe(stats.layers["spinners.tier"]) == "180% of a CPU, no CPUs of its own"
    assert describe(stats.layers["rest"]) == "37% of a CPU on 2-3"
    assert describe(LayerStats(util=5.0, cpus=frozenset({0, 2, 3, 5}))) == "5% of a CPU on 0,2-3,5"
    assert describe(None) == "-" and describe(LayerStats()) == "-"


def test_layer_view_puts_the_stats_beside_a_plan_layer():
    views = scx_layer_views(SysStats.from_json(REPLY))
    assert views["rest"] == LayerScxView(util_pct=37.2, tasks=39, cpus_held=2, cpus=[2, 3], text="37% of a CPU on 2-3")
    assert "not.there" not in views and scx_layer_views(None) == {}
