"""Planner sizing rules on real machine shapes (sysfs fixture trees), including the seed's examples."""

import random

from fixture_shapes import load_fixture_shape

from temperd.decide.matcher import ThreadMatch, Workload
from temperd.plan import CONFINED, FENCED, GROUPED, LATENCY, OPEN, OWNED
from temperd.decide.planner import PlannerSettings, exclusive_cores, plan
from temperd.config.profile import parse_profile

HOT = """
schema_version = 1
id = "hot"
[[thread_groups]]
name = "compute"
busiest = {n}
treatment = "exclusive"
cpu_fraction = {fraction}
[[thread_groups]]
name = "io"
thread_names = ["io-*"]
treatment = "latency"
[[thread_groups]]
name = "rest"
catch_all = true
treatment = "yield"
"""


def hot_profile(n=3, fraction=1.0, pid="hot"):
    return parse_profile(HOT.format(n=n, fraction=fraction).replace('id = "hot"', f'id = "{pid}"'), f"{pid}.toml")


def workload(key, profile_id, groups, budget=None, tier="critical", pid=1000):
    threads, tid = [], pid
    for group, count in groups:
        for _ in range(count):
            threads.append(ThreadMatch(tid, pid, f"t{tid}", group, "test"))
            tid += 1
    return Workload(key=key, profile_id=profile_id, tier=tier, budget=budget, budget_reason="test budget",
                    source="binding", reason="test", unit=key if key.endswith(".service") else None,
                    cgroup=f"/system.slice/{key}" if key.endswith(".service") else None, pids=(pid,),
                    threads=tuple(threads))


def only(plan_, kind=None, group=None):
    layers = [l for l in plan_.layers if (kind is None or l.kind == kind) and (group is None or l.group == group)]
    assert len(layers) == 1, layers
    return layers[0]


def test_three_hot_threads_get_three_whole_cores_with_idle_siblings_on_c2_standard_8():
    shape = load_fixture_shape("gcp-c2-standard-8")
    w = workload("onnx.service", "hot", [("compute", 3), ("rest", 2)], budget=3.0)
    p = plan(shape, [w], {"hot": hot_profile(3)})
    layer = only(p, group="compute")
    assert layer.kind == CONFINED and layer.protected
    assert len(layer.cpus) == 3
    cores = {shape.core_of(cpu).core_key for cpu in layer.cpus}
    assert len(cores) == 3, "each hot thread on its own physical core"
    assert sorted(layer.idle_siblings) == sorted(s for cpu in layer.cpus for s in shape.siblings(cpu) if s != cpu)
    assert not set(p.reserve_cpus) & set(layer.cpus + layer.idle_siblings)
    assert set(p.reserve_cpus) == set(shape.core_of(0).cpus)
    assert only(p, group="rest").policy == "idle"


def test_same_demand_is_demoted_to_shared_cpus_at_its_own_nice_on_c2_standard_4():
    """Demoted, a group keeps its own nice (0 unless its profile sets one): raised to the latency
    nice, a pool took the share of what ran beside it (docs/benchmarks.md, PostgreSQL's backends)."""
    shape = load_fixture_shape("gcp-c2-standard-4")
    w = workload("onnx.service", "hot", [("compute", 3)], budget=3.0)
    p = plan(shape, [w], {"hot": hot_profile(3)})
    layer = only(p, group="compute")
    assert (layer.kind, layer.treatment, layer.cpus, layer.nice) == (OPEN, LATENCY, (), 0)
    assert layer.holds_cpus is None
    assert any("demoted to shared CPUs at nice 0" in d and "needs 3 whole core(s)" in d for d in p.decisions)
    assert any("demoted" in r for r in layer.reasons)
    own = parse_profile(HOT.format(n=3, fraction=1.0).replace('cpu_fraction = 1.0', 'cpu_fraction = 1.0\nnice = -5'),
                        "hot.toml")
    assert only(plan(shape, [w], {"hot": own}), group="compute").nice == -5


def test_llama_cpp_cpu_fraction_arithmetic_for_a_2250m_budget():
    assert exclusive_cores(2.25, 0.85) == 2
    assert exclusive_cores(2.25, 0.9) == 3
    shape = load_fixture_shape("gcp-c2-standard-8")
    for fraction, cores in ((0.85, 2), (0.9, 3)):
        w = workload("llama.service", "hot", [("compute", 2)], budget=2.25)
        layer = only(plan(shape, [w], {"hot": hot_profile(2, fraction)}), group="compute")
        assert (layer.kind, len(layer.cpus)) == (CONFINED, cores)
        assert any(f"cpu_fraction {fraction:g}) = {cores} whole core(s)" in r for r in layer.reasons)


def test_m5_xlarge_two_hot_threads_never_share_a_physical_core():
    """Two cores asked, one left beside the reserve: demoted to shared CPUs rather than two threads
    on the SMT siblings of one core."""
    shape = load_fixture_shape("aws-m5.xlarge")
    assert shape.core_of(0).cpus == (0, 2)
    w = workload("llama.service", "hot", [("compute", 2)], budget=2.0)
    layer = only(plan(shape, [w], {"hot": hot_profile(2)}), group="compute")
    assert (layer.kind, layer.treatment, layer.cpus) == (OPEN, LATENCY, ())
    one = only(plan(shape, [workload("llama.service", "hot", [("compute", 1)], budget=1.0)], {"hot": hot_profile(1)}),
               group="compute")
    assert one.cpus == (1,) and one.idle_siblings == (3,)


def test_one_hot_thread_on_m5_xlarge_gets_a_whole_core_outside_the_reserve():
    shape = load_fixture_shape("aws-m5.xlarge")
    w = workload("redis.service", "hot", [("compute", 1)], budget=1.0)
    layer = only(plan(shape, [w], {"hot": hot_profile(1)}), group="compute")
    assert layer.kind == CONFINED and layer.cpus == (1,) and layer.idle_siblings == (3,)


def test_64_core_host_places_exclusive_cores_on_distinct_physical_cores():
    shape = load_fixture_shape("dual-socket-64c")
    w = workload("db.service", "hot", [("compute", 8)], budget=8.0)
    layer = only(plan(shape, [w], {"hot": hot_profile(8)}), group="compute")
    assert layer.kind == CONFINED and len(layer.cpus) == 8
    assert len({shape.core_of(c).core_key for c in layer.cpus}) == 8
    assert len(layer.idle_siblings) == 8


def test_no_budget_means_one_core_per_member_thread():
    shape = load_fixture_shape("gcp-c2-standard-8")
    w = workload("x.service", "hot", [("compute", 2)], budget=None)
    layer = only(plan(shape, [w], {"hot": hot_profile(2)}), group="compute")
    assert len(layer.cpus) == 2 and any("one per member thread" in r for r in layer.reasons)


def test_critical_tier_is_served_first_and_later_demand_is_demoted():
    shape = load_fixture_shape("gcp-c2-standard-8")
    profiles = {"hot": hot_profile(2)}
    standard = workload("a.service", "hot", [("compute", 2)], budget=2.0, tier="standard", pid=2000)
    critical = workload("z.service", "hot", [("compute", 2)], budget=2.0, tier="critical", pid=3000)
    p = plan(shape, [standard, critical], profiles)
    assert [l.workload for l in p.layers if l.group == "compute"] == ["z.service", "a.service"]
    z, a = [l for l in p.layers if l.group == "compute"]
    assert (z.kind, a.kind, a.treatment) == (CONFINED, OPEN, LATENCY)


def test_plan_is_deterministic():
    shape = load_fixture_shape("dual-socket-64c")
    profiles = {"hot": hot_profile(4)}
    loads = [workload(f"w{i}.service", "hot", [("compute", 4), ("io", 1), ("rest", 3)], budget=4.0,
                      tier=("critical", "standard", "background")[i % 3], pid=1000 * (i + 1)) for i in range(6)]
    first = plan(shape, loads, profiles)
    shuffled = list(loads)
    random.Random(7).shuffle(shuffled)
    assert plan(shape, shuffled, profiles) == first


def test_critical_workload_without_profile_gets_a_tier_layer():
    shape = load_fixture_shape("gcp-c2-standard-8")
    w = workload("cache.service", None, [(None, 3)], budget=2.0)
    p = plan(shape, [w], {}, PlannerSettings())
    layer = only(p)
    assert layer.kind == GROUPED and len(layer.cpus) == 2
    assert len({shape.core_of(c).core_key for c in layer.cpus}) == 2
    assert p.cgroup_weights[0].weight == 1000 and p.cgroup_weights[0].unit == "cache.service"


def test_standard_workload_without_profile_gets_only_its_tier_weight():
    shape = load_fixture_shape("gcp-c2-standard-8")
    p = plan(shape, [workload("web.service", None, [(None, 2)], tier="standard")], {})
    assert p.layers == () and p.cgroup_weights[0].weight == 100


def test_latency_and_yield_layers_are_open():
    shape = load_fixture_shape("this-host")
    w = workload("x.service", "hot", [("compute", 1), ("io", 2), ("rest", 2)], budget=1.0)
    p = plan(shape, [w], {"hot": hot_profile(1)})
    io, rest = only(p, group="io"), only(p, group="rest")
    assert (io.kind, io.nice) == (OPEN, -10) and (rest.kind, rest.policy) == (OPEN, "idle")
    assert only(p, group="compute").cpus == (1,) and p.reserve_cpus == (0,)


def test_background_workload_without_profile_yields():
    shape = load_fixture_shape("gcp-c2-standard-8")
    p = plan(shape, [workload("batch.service", None, [(None, 3)], tier="background")], {})
    layer = only(p)
    assert (layer.kind, layer.treatment, layer.policy, len(layer.selector.tids)) == (OPEN, "yield", "idle", 3)
    assert p.cgroup_weights[0].weight == 10


def test_exclusive_cores_are_owned_by_default_and_fenced_where_the_group_asks():
    shape = load_fixture_shape("gcp-c2-standard-8")
    owned = only(plan(shape, [workload("a.service", "hot", [("compute", 1)], budget=1.0)], {"hot": hot_profile(1)}),
                 group="compute")
    assert (owned.kind, owned.ownership, owned.holds_cpus) == (CONFINED, OWNED, OWNED)
    assert any("owned: its threads run there first" in r for r in owned.reasons)
    fenced_profile = parse_profile(HOT.format(n=1, fraction=1.0).replace(
        'cpu_fraction = 1.0', 'cpu_fraction = 1.0\nownership = "fenced"'), "hot.toml")
    fenced = only(plan(shape, [workload("a.service", "hot", [("compute", 1)], budget=1.0)], {"hot": fenced_profile}),
                  group="compute")
    assert (fenced.kind, fenced.holds_cpus) == (CONFINED, FENCED)
    assert any("fenced: no other thread runs there" in r for r in fenced.reasons)


def test_an_owned_critical_group_polls_while_idle_unless_its_profile_or_the_tier_says_otherwise():
    """[tiers.X] idle_resume_us: the bound on the CPUs a tier's exclusive groups own where the
    profile sets none (critical: 0, the CPUs poll); a demoted group owns no CPUs and gets none."""
    shape = load_fixture_shape("gcp-c2-standard-8")
    critical = workload("redis.service", "hot", [("compute", 1), ("rest", 1)], budget=1.0)
    layer = only(plan(shape, [critical], {"hot": hot_profile(1)}, PlannerSettings()), group="compute")
    assert layer.kind == CONFINED and layer.idle_resume_us == 0
    assert any("poll" in reason and "critical tier's idle_resume_us" in reason for reason in layer.reasons)
    standard = workload("redis.service", "hot", [("compute", 1), ("rest", 1)], budget=1.0, tier="standard")
    assert only(plan(shape, [standard], {"hot": hot_profile(1)}, PlannerSettings()), group="compute").idle_resume_us is None
    off = PlannerSettings(idle_resume_us=(("background", -1), ("critical", -1), ("standard", 20)))
    assert only(plan(shape, [critical], {"hot": hot_profile(1)}, off), group="compute").idle_resume_us is None
    assert only(plan(shape, [standard], {"hot": hot_profile(1)}, off), group="compute").idle_resume_us == 20
    own = parse_profile(HOT.format(n=1, fraction=1.0).replace('cpu_fraction = 1.0', 'cpu_fraction = 1.0\nidle_resume_us = 50'),
                        "hot.toml")
    assert only(plan(shape, [critical], {"hot": own}, PlannerSettings()), group="compute").idle_resume_us == 50
    small = load_fixture_shape("gcp-c2-standard-4")
    wide = workload("onnx.service", "hot", [("compute", 3), ("rest", 2)], budget=3.0)
    demoted = only(plan(small, [wide], {"hot": hot_profile(3)}, PlannerSettings()), group="compute")
    assert demoted.kind == OPEN and demoted.idle_resume_us is None
