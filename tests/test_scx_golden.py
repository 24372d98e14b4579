"""Golden scx_layered configs: builtin profiles planned on real machine shapes (sysfs fixture trees).

Each case plans one workload of a builtin profile on a fixture shape, renders the plan and
compares it with tests/fixtures/scx_golden/<shape>--<profile>.json. Beyond the file, each
config must pass the validator, the exclusive layer must get the CPU count the planner computed
(its whole cores: CPUs plus the siblings kept idle), and a first-match simulation must put each
thread name in its group's layer. TEMPERD_UPDATE_GOLDEN=1 rewrites the files (review the diff).
"""

import dataclasses
import json
import os

import pytest
from fixture_shapes import load_fixture_shape
from test_scx_render import layer_of

from temperd.backends.scx.render import render_plan
from temperd.backends.scx.validate import validate_config
from temperd.decide.matcher import ThreadMatch, Workload
from temperd.plan import CONFINED, EXCLUSIVE, FENCED, GROUPED, LATENCY, OPEN, OWNED, YIELD
from temperd.decide.planner import exclusive_cores, plan
from temperd.config.profileset import load_builtin_profiles

GOLDEN_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "scx_golden")
BUILTINS = {p.id: p for p in load_builtin_profiles()}

# Thread names as the servers really name them (docs/profile-evidence.md), per thread group.
THREADS = {
    "mysql-innodb": {"connections": ["connection"] * 12 + ["one_connection"] * 2, "innodb-io": [
        "ib_io_rd-1", "ib_io_wr-1", "ib_io_log", "ib_pg_flush_co", "page_cleaner", "ib_log_writer"],
        "unnamed": ["mysqld"], "background": ["ib_src_main", "ib_buf_dump", "sig_handler", "evt_sched"]},
    "onnx-inference": {"intra-op": ["python3"] * 8, "serving": ["python3"] * 3},
}
UNITS = {"mysql-innodb": "mysql.service", "onnx-inference": "onnx-serve.service"}
# CPU budgets that fit the exclusive groups on each shape (reserve_cpus = 1: one whole core kept).
BUDGETS = {"aws-m5.xlarge": 1.0, "gcp-c2-standard-8": 3.0, "dual-socket-64c": 16.0}
CASES = [(shape, profile) for shape in BUDGETS for profile in THREADS]
OWNERSHIP_SUFFIX = {FENCED: "", OWNED: "--owned"}  # the fenced files keep their original names


def workload(profile_id, budget, pid=4000):
    threads, tid = [], pid
    for group, names in THREADS[profile_id].items():
        for name in names:
            threads.append(ThreadMatch(tid, pid, name, group, "golden"))
            tid += 1
    unit = UNITS[profile_id]
    return Workload(key=unit, profile_id=profile_id, tier="critical", budget=budget, budget_reason="binding cpus",
                    source="binding", reason="golden", unit=unit, cgroup=f"/system.slice/{unit}", pids=(pid,),
                    threads=tuple(threads))


def planned(shape_name, profile_id, budget=None, ownership=None):
    """The plan; with `ownership`, its exclusive layers set to it (whatever the planner's default)."""
    shape = load_fixture_shape(shape_name)
    w = workload(profile_id, BUDGETS[shape_name] if budget is None else budget)
    layer_plan = plan(shape, [w], {profile_id: BUILTINS[profile_id]})
    if ownership is not None:
        layer_plan = dataclasses.replace(layer_plan, layers=tuple(
            dataclasses.replace(l, ownership=ownership) if l.treatment == EXCLUSIVE else l for l in layer_plan.layers))
    return shape, w, layer_plan


def golden(name, config):
    path = os.path.join(GOLDEN_DIR, name + ".json")
    text = json.dumps(config, indent=2, sort_keys=True) + "\n"
    if os.environ.get("TEMPERD_UPDATE_GOLDEN"):
        os.makedirs(GOLDEN_DIR, exist_ok=True)
        with open(path, "w") as handle:
            handle.write(text)
    with open(path) as handle:
        assert json.loads(handle.read()) == json.loads(text), f"{path} differs from the rendered config"


@pytest.mark.parametrize("ownership", [FENCED, OWNED])
@pytest.mark.parametrize("shape_name,profile_id", CASES)
def test_builtin_profile_on_fixture_shape_renders_the_golden_valid_config(shape_name, profile_id, ownership):
    shape, w, layer_plan = planned(shape_name, profile_id, ownership=ownership)
    assert not layer_plan.errors
    rendered = render_plan(layer_plan, shape.n_cpus)
    config = rendered.config
    assert validate_config(config, cpu_count=shape.n_cpus) == []
    golden(f"{shape_name}--{profile_id}{OWNERSHIP_SUFFIX[ownership]}", config)

    # The exclusive group's layer holds the planner's whole cores: fenced, a protected Confined
    # layer; owned, a Grouped one others may borrow from, whose owners preempt borrowers, holding
    # one CPU of each core (scx_layered run with --allow-partial-core: the siblings stay everyone's).
    exclusive = [l for l in layer_plan.layers if l.treatment == EXCLUSIVE]
    assert len(exclusive) == 1
    layer = exclusive[0]
    group = next(g for g in BUILTINS[profile_id].thread_groups if g.name == layer.group)
    cores = exclusive_cores(w.budget, group.cpu_fraction)
    assert layer.kind == CONFINED and len(layer.cpus) == cores
    spec = next(s for s in config if s["name"] == layer.name)
    whole_cores = len(layer.cpus) + len(layer.idle_siblings)
    assert whole_cores == cores * shape.threads_per_core
    (kind, body), = spec["kind"].items()
    if ownership == FENCED:
        assert kind == CONFINED and body["protected"] is True
        assert body["cpus_range"] == [whole_cores, whole_cores] and rendered.options == ()
    else:
        assert kind == GROUPED and body["protected"] is False and body["preempt"] and body["preempt_first"]
        partial = shape.threads_per_core > 1
        assert rendered.options == (("--allow-partial-core",) if partial else ())
        held_cpus = len(layer.cpus) if partial else whole_cores
        assert body["cpus_range"] == [held_cpus, held_cpus] and ("exclusive" in body) is False
    held = [s["kind"].get(CONFINED, s["kind"].get(GROUPED, {})).get("cpus_range", [0])[0] for s in config]
    assert sum(held) <= shape.n_cpus - 1
    # Yield groups hold no CPUs: they run from the low fallback queue, below the standard tier.
    for l in layer_plan.layers:
        if l.treatment == YIELD:
            assert next(s for s in config if s["name"] == l.name)["kind"][GROUPED]["cpus_range"] == [0, 0]

    # Every thread lands in its own group's layer (busiest groups by thread id).
    by_group = {l.group: l.name for l in layer_plan.layers}
    for t in w.threads:
        found = layer_of(config, w.cgroup, t.comm, tgid=t.pid, tid=t.tid)
        assert found == by_group[t.group], f"{t.comm} ({t.group}) matched {found}"


def test_exclusive_demand_beyond_the_shape_renders_the_demoted_group_as_an_open_layer():
    shape, w, layer_plan = planned("aws-m5.xlarge", "onnx-inference", budget=2.0)  # 2 cores asked, 1 free
    assert not [l for l in layer_plan.layers if l.treatment == EXCLUSIVE]
    layer = next(l for l in layer_plan.layers if any("demoted" in r for r in l.reasons))
    assert (layer.kind, layer.treatment, layer.cpus) == (OPEN, LATENCY, ())
    config = render_plan(layer_plan, shape.n_cpus).config
    assert validate_config(config, cpu_count=shape.n_cpus) == []
    spec = next(s for s in config if s["name"] == layer.name)
    assert OPEN in spec["kind"]
