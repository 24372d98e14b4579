"""LayerPlan → scx_layered config, with hand-built plans (golden tests on fixture shapes come with the planner)."""

import dataclasses
import json

import pytest

from temperd.backends.scx.render import (CATCH_ALL_NAME, RenderError, comm_prefix, cgroup_prefix, render_plan)
from temperd.backends.scx.validate import validate_config
from temperd.backends.scx.kinds import LOW_FALLBACK, PREEMPTING, YIELD_SLICE_US, level_of
from temperd.plan import (CONFINED, EXCLUSIVE, FENCED, GROUPED, LATENCY, OPEN, OWNED, YIELD, Layer, LayerPlan, MemberSelector)

MYSQL_CGROUP = "/system.slice/mysql.service"


def render(plan, cpu_count):
    """The scx_layered config the plan renders to."""
    return render_plan(plan, cpu_count).config


def layer(name, kind, treatment, selector, **kw):
    kw.setdefault("tier", "critical")
    kw.setdefault("workload", "mysql")
    kw.setdefault("ownership", FENCED)  # these tests' exclusive layers are fenced unless one says owned
    return Layer(name=name, kind=kind, treatment=treatment, group=name.split(".")[-1], selector=selector, **kw)


def mysql_plan(smt=True):
    sel = dict(cgroup=MYSQL_CGROUP, pids=(4100,))
    return LayerPlan(layers=(
        layer("mysql.connections", CONFINED, EXCLUSIVE,
              MemberSelector(comm_patterns=("connection", "xpl_worker*"), tids=(4101, 4102), **sel),
              cpus=(2, 3), idle_siblings=(6, 7) if smt else (), weight=1000, protected=True),
        layer("mysql.io", OPEN, LATENCY, MemberSelector(comm_patterns=("ib_io_*", "ib_log_*"), tids=(4103,), **sel),
              weight=500, slice_us=1000),
        layer("mysql.background", OPEN, YIELD, MemberSelector(comm_patterns=("ib_*",), tids=(4104,), **sel),
              weight=50, policy="batch", nice=10),
        layer("mysql.rest", OPEN, YIELD, MemberSelector(catch_all=True, tids=(4100,), **sel), weight=50, policy="idle"),
    ), reserve_cpus=(0, 1, 4, 5) if smt else (0, 1))


# A first-match simulation of scx_layered's matching (main.bpf.c match_layer) for the terms the renderer uses.
def term_matches(term, task):
    (kind, value), = term.items()
    if kind == "CgroupPrefix":
        return task["cgroup"].startswith(value)
    if kind == "CommPrefix":
        return task["comm"].startswith(value)
    if kind == "TGIDEquals":
        return task["tgid"] == value
    if kind == "PIDEquals":
        return task["tid"] == value
    raise AssertionError(f"the simulation does not know {kind}")


def layer_of(config, cgroup, comm, tgid=1, tid=None):
    task = {"cgroup": cgroup.strip("/") + "/", "comm": comm, "tgid": tgid, "tid": tid if tid is not None else tgid}
    for spec in config:
        if any(all(term_matches(t, task) for t in block) for block in spec["matches"]):
            return spec["name"]
    raise AssertionError("no layer matched: the last layer must be [[]]")


def test_mysql_plan_renders_valid_config_with_threads_in_the_right_layers():
    rendered = render_plan(mysql_plan(), 8)
    config = rendered.config
    assert validate_config(config, cpu_count=8) == []
    assert [s["name"] for s in config] == ["mysql.connections", "mysql.io", "mysql.background", "mysql.rest",
                                           CATCH_ALL_NAME]
    assert config[-1]["matches"] == [[]] and config[-1]["kind"] == {"Open": {}}
    cg = MYSQL_CGROUP
    assert layer_of(config, cg, "connection") == "mysql.connections"
    assert layer_of(config, cg, "xpl_worker-3") == "mysql.connections"
    assert layer_of(config, cg, "ib_io_rd-1") == "mysql.io"
    assert layer_of(config, cg, "ib_pg_flush") == "mysql.background"
    assert layer_of(config, cg, "mysqld") == "mysql.rest"
    assert layer_of(config, "/system.slice/mysql.service2", "connection") == CATCH_ALL_NAME
    assert layer_of(config, "/user.slice/session-1.scope", "connection") == CATCH_ALL_NAME
    # "connection" is a plain name: matching it as a prefix is wider, and the note says so.
    assert any("thread name 'connection' matches as a prefix" in n.message for n in rendered.notes if n.layer == "mysql.connections")


def test_fenced_exclusive_layer_is_confined_protected_on_whole_cores():
    smt = render(mysql_plan(smt=True), 8)[0]["kind"]
    assert smt == {"Confined": {"util_range": [0.0, 1.0], "cpus_range": [4, 4], "protected": True, "exclusive": True,
                                "weight": 1000}}
    flat = render(mysql_plan(smt=False), 4)[0]["kind"]["Confined"]
    assert flat["cpus_range"] == [2, 2]


def owned(plan):
    return dataclasses.replace(plan, layers=tuple(dataclasses.replace(l, ownership=OWNED) for l in plan.layers))


def test_owned_exclusive_layer_is_grouped_unprotected_and_takes_its_cpus_back_first():
    """OWNED: others borrow the layer's CPUs while its queue is empty (not protected), and a waking
    owner preempts a non-preempting borrower on its previous CPU first (preempt + preempt_first).
    It holds one CPU of each of its cores; the SMT siblings stay every layer's, as under the native
    backend, with scx_layered allocating single CPUs (--allow-partial-core)."""
    rendered = render_plan(owned(mysql_plan(smt=True)), 8)
    assert rendered.config[0]["kind"] == {"Grouped": {
        "util_range": [0.0, 1.0], "cpus_range": [2, 2], "protected": False, "preempt": True, "preempt_first": True,
        "weight": 1000}}
    assert rendered.options == ("--allow-partial-core",)
    assert validate_config(rendered.config, cpu_count=8) == []
    flat = render_plan(owned(mysql_plan(smt=False)), 4)
    assert flat.config[0]["kind"]["Grouped"]["cpus_range"] == [2, 2] and "exclusive" not in flat.config[0]["kind"]["Grouped"]
    assert flat.options == ()  # no siblings to leave: whole cores are single CPUs
    # Only the exclusive group changes with ownership.
    assert render(owned(mysql_plan()), 8)[1:] == render(mysql_plan(), 8)[1:]
    assert render_plan(mysql_plan(), 8).options == ()


def test_beside_a_fenced_group_an_owned_one_keeps_its_whole_cores():
    """Single-CPU allocation could split the fenced group's cores (scx_layered's alloc_cpus takes
    what a core has left and moves on): with one in the plan, the owned group holds whole cores,
    its siblings idle while a member runs, and scx_layered allocates whole cores."""
    fenced = mysql_plan(smt=True)
    other = dataclasses.replace(fenced.layers[0], name="pg.backends", ownership=OWNED, cpus=(8,), idle_siblings=(9,),
                                selector=MemberSelector(tids=(5101,), pids=(5100,)))
    rendered = render_plan(dataclasses.replace(fenced, layers=fenced.layers + (other,)), 12)
    kinds = {spec["name"]: spec["kind"] for spec in rendered.config}
    assert kinds["pg.backends"]["Grouped"]["cpus_range"] == [2, 2] and kinds["pg.backends"]["Grouped"]["exclusive"]
    assert kinds["mysql.connections"]["Confined"]["cpus_range"] == [4, 4]
    assert rendered.options == ()


def test_owned_layers_count_against_the_host_like_fenced_ones():
    plan = owned(mysql_plan(smt=True))
    with pytest.raises(RenderError, match="Grouped on 2 CPUs but the host has 1"):
        render(plan, 1)
    with pytest.raises(RenderError, match="Confined on 4 CPUs but the host has 2"):
        render(mysql_plan(smt=True), 2)


def test_latency_layer_preempts_and_open_layers_carry_no_weight():
    """scx_layered's dispatch ignores `weight` (it only divides CPUs among Confined/Grouped layers)."""
    config = render(mysql_plan(), 8)
    assert config[1]["kind"] == {"Open": {"preempt": True, "slice_us": 1000}}
    assert all("weight" not in body for spec in config for kind, body in spec["kind"].items() if kind == "Open")


def test_yield_layers_hold_no_cpus_so_they_run_from_the_low_fallback_queue():
    rendered = render_plan(mysql_plan(), 8)
    config = rendered.config
    for spec in config[2:4]:  # SCHED_BATCH and SCHED_IDLE groups alike
        assert spec["kind"] == {"Grouped": {"util_range": [0.0, 1.0], "cpus_range": [0, 0], "slice_us": YIELD_SLICE_US}}
    assert any("SCHED_BATCH" in n.message for n in rendered.notes if n.layer == "mysql.background")
    assert config[-1]["kind"] == {"Open": {}}  # the standard tier: above the yield layers, below latency


def test_background_tier_layer_runs_from_the_low_fallback_queue():
    sel = MemberSelector(cgroup="/system.slice/batch.service", pids=(20,), catch_all=True, tids=(20,))
    plan = LayerPlan((layer("batch.tier", OPEN, YIELD, sel, tier="background", workload="batch", weight=10,
                            policy="idle"),), reserve_cpus=(0,))
    spec = render(plan, 4)[0]
    assert spec["kind"] == {"Grouped": {"util_range": [0.0, 1.0], "cpus_range": [0, 0], "slice_us": YIELD_SLICE_US}}
    assert level_of(plan.layers[0]) == LOW_FALLBACK
    assert level_of(dataclasses.replace(plan.layers[0], treatment=LATENCY)) == PREEMPTING


def test_a_yield_slice_longer_than_the_bound_is_cut():
    sel = MemberSelector(cgroup="/system.slice/x.service", pids=(20,), comm_patterns=("gc*",), tids=(21,))
    plan = LayerPlan((layer("x.gc", OPEN, YIELD, sel, policy="idle", slice_us=20000),
                      layer("x.y", OPEN, YIELD, sel, policy="idle", slice_us=500)), reserve_cpus=(0,))
    config = render(plan, 4)
    assert [s["kind"]["Grouped"]["slice_us"] for s in config[:2]] == [YIELD_SLICE_US, 500]


def test_demoted_exclusive_layer_is_grouped_with_preempt():
    sel = MemberSelector(cgroup="/system.slice/app.service", pids=(10,), comm_patterns=("work*",), tids=(11,))
    plan = LayerPlan((layer("app.work", GROUPED, EXCLUSIVE, sel, cpus=(1, 2, 3), weight=1000),), reserve_cpus=(0,))
    (spec, rest) = render(plan, 4)
    assert spec["kind"] == {"Grouped": {"util_range": [0.0, 1.0], "cpus_range": [3, 3], "protected": False,
                                        "preempt": True, "weight": 1000}}
    assert validate_config([spec, rest], cpu_count=4) == []


@pytest.mark.parametrize("pattern,prefix,exact,note", [
    ("ib_*", "ib_", True, None),
    ("mc-worker", "mc-worker", False, "matches as a prefix"),
    ("ib_*_wr", "ib_", False, "widened to the prefix 'ib_'"),
    ("a[0-9]", "a", False, "widened"),
    ("averyveryverylongname*", "averyveryverylo", False, "cut to 15 bytes"),
    ("averyveryverylongname", "averyveryverylo", False, "first 15 bytes"),
    ("*worker", None, False, "starts with a wildcard"),
])
def test_comm_prefix(pattern, prefix, exact, note):
    found = comm_prefix(pattern)
    assert (found.prefix, found.exact) == (prefix, exact)
    assert (found.note is None) if note is None else (note in found.note)
    assert found.prefix is None or len(found.prefix.encode()) <= 15


def test_cgroup_prefix():
    assert cgroup_prefix("/system.slice/x.service") == "system.slice/x.service/"
    assert cgroup_prefix("/system.slice/x.service/") == "system.slice/x.service/"
    assert cgroup_prefix("/") is None and cgroup_prefix(None) is None


def test_covered_prefixes_are_merged_and_unexpressible_globs_left_out():
    sel = MemberSelector(cgroup="/a.service", pids=(10,), comm_patterns=("ib_io*", "ib_*", "*_wr"), tids=(11,))
    rendered = render_plan(LayerPlan((layer("a.x", OPEN, LATENCY, sel),), ()), 2)
    assert rendered.config[0]["matches"] == [[{"CgroupPrefix": "a.service/"}, {"CommPrefix": "ib_"}]]
    assert any("left out '*_wr'" in n.message for n in rendered.notes)


def test_layer_with_only_unexpressible_globs_matches_its_member_threads():
    sel = MemberSelector(cgroup="/a.service", pids=(10,), comm_patterns=("*_wr",), tids=(12, 13))
    rendered = render_plan(LayerPlan((layer("a.x", OPEN, LATENCY, sel),), ()), 2)
    assert rendered.config[0]["matches"] == [[{"PIDEquals": 12}], [{"PIDEquals": 13}]]


def test_workload_without_cgroup_is_matched_by_process():
    sel = MemberSelector(pids=(300, 301), comm_patterns=("w*", "io*"), tids=(302,))
    catch = MemberSelector(pids=(300, 301), catch_all=True, tids=(300, 301))
    plan = LayerPlan((layer("p.rest", OPEN, YIELD, catch, weight=50), layer("p.w", OPEN, LATENCY, sel)), ())
    config = render(plan, 2)
    # the catch-all layer moves after the specific one: first match wins in scx_layered
    assert [s["name"] for s in config] == ["p.w", "p.rest", CATCH_ALL_NAME]
    assert config[0]["matches"] == [[{"TGIDEquals": 300}, {"CommPrefix": "w"}], [{"TGIDEquals": 300}, {"CommPrefix": "io"}],
                                    [{"TGIDEquals": 301}, {"CommPrefix": "w"}], [{"TGIDEquals": 301}, {"CommPrefix": "io"}]]
    assert config[1]["matches"] == [[{"TGIDEquals": 300}], [{"TGIDEquals": 301}]]
    assert layer_of(config, "/", "worker", tgid=301, tid=305) == "p.w"
    assert layer_of(config, "/", "main", tgid=301) == "p.rest"
    assert layer_of(config, "/", "worker", tgid=999) == CATCH_ALL_NAME


def test_process_titles_become_the_processes_the_planner_saw():
    sel = MemberSelector(cgroup="/system.slice/postgresql.service", pids=(500, 501, 502),
                         title_patterns=("postgres: .* (idle|SELECT)",), tids=(501, 502, 777))
    rendered = render_plan(LayerPlan((layer("pg.backends", OPEN, LATENCY, sel),), ()), 2)
    assert rendered.config[0]["matches"] == [[{"TGIDEquals": 501}], [{"TGIDEquals": 502}], [{"PIDEquals": 777}]]
    assert any("process titles" in n.message for n in rendered.notes)


def test_busiest_threads_become_thread_ids():
    sel = MemberSelector(cgroup="/onnx.service", pids=(60,), tids=(61, 62))
    config = render(LayerPlan((layer("onnx.compute", CONFINED, EXCLUSIVE, sel, cpus=(1,)),), ()), 2)
    assert config[0]["matches"] == [[{"PIDEquals": 61}], [{"PIDEquals": 62}]]


def test_catch_all_name_does_not_collide():
    sel = MemberSelector(cgroup="/a.service", catch_all=True)
    config = render(LayerPlan((layer("rest", OPEN, YIELD, sel),), ()), 2)
    assert [s["name"] for s in config] == ["rest", "temperd-rest"]


def test_unexpressible_plan_raises_one_error_listing_every_problem():
    many = tuple(layer(f"w{i}.tier", OPEN, LATENCY, MemberSelector(cgroup=f"/w{i}.service", catch_all=True))
                 for i in range(16))
    wide = layer("big.tier", OPEN, LATENCY, MemberSelector(pids=tuple(range(1000, 1033)), catch_all=True))
    huge = layer("db.conn", CONFINED, EXCLUSIVE, MemberSelector(cgroup="/db.service", comm_patterns=("c*",)),
                 cpus=(0, 1, 2))
    with pytest.raises(RenderError) as caught:
        render(LayerPlan(many[:14] + (wide, huge), ()), 2)
    problems = caught.value.problems
    assert any("16 layers plus the catch-all exceed scx_layered's 16" in p for p in problems)
    assert any(p.startswith("layer big.tier: needs 33 OR blocks") for p in problems)
    assert any(p.startswith("layer db.conn: Confined on 3 CPUs but the host has 2") for p in problems)
    assert "cannot be expressed" in str(caught.value)
    assert len(render(LayerPlan(many[:15], ()), 2)) == 16  # 15 layers + the catch-all fit


def test_layer_with_nothing_to_match_is_an_error():
    with pytest.raises(RenderError, match="no member threads to match"):
        render(LayerPlan((layer("x.y", OPEN, LATENCY, MemberSelector()),), ()), 2)


def test_rendered_json_round_trips():
    rendered = render_plan(mysql_plan(), 8)
    assert json.loads(rendered.to_json()) == rendered.config
    assert render(mysql_plan(), 8) == rendered.config


def test_a_resume_bound_of_zero_is_said_not_rendered_and_a_positive_one_is_rendered():
    """scx_layered writes its idle_resume_us to pm_qos_resume_latency_us as a number, and the file
    reads "0" as no constraint: a bound of 0 (poll while idle) cannot be expressed."""
    def with_bound(bound):
        plan = mysql_plan(smt=False)
        first = dataclasses.replace(plan.layers[0], idle_resume_us=bound)
        return render_plan(dataclasses.replace(plan, layers=(first, *plan.layers[1:])), 4)

    zero = with_bound(0)
    assert "idle_resume_us" not in zero.config[0]["kind"]["Confined"]
    assert any("idle_resume_us 0" in note.message and "no constraint" in note.message for note in zero.notes)
    assert with_bound(20).config[0]["kind"]["Confined"]["idle_resume_us"] == 20
    assert validate_config(with_bound(20).config, cpu_count=4) == []
