"""What owned and fenced mean where an operator reads them: the placement linter (a borrower on an
owned CPU is no violation, on a fenced one it is), the journal, and `temperctl plan` / `status`."""

from __future__ import annotations

import pytest
from fixture_shapes import fixture_root

from temperctl.plan_cmd import treatment_text
from temperd.config.errors import ConfigError
from temperd.config.profile import parse_profile
from temperd.observe.journal import describe_layer
from temperd.observe.linter import lint
from temperd.control.status import OverheadView
from temperd.observe.observer import Observation, ThreadSample
from temperd.plan import CONFINED, EXCLUSIVE, FENCED, LATENCY, OPEN, OWNED, Layer, LayerPlan, MemberSelector
from temperd.sources.shape import read_shape


def hot(ownership) -> Layer:
    return Layer("app.hot", CONFINED, EXCLUSIVE, "critical", "app", "hot", MemberSelector(tids=(50,)), cpus=(3,),
                 idle_siblings=(7,), protected=True, ownership=ownership)


def test_a_busy_borrower_on_an_owned_cpu_is_no_violation_and_on_a_fenced_one_is():
    shape = read_shape(fixture_root("gcp-c2-standard-8"))

    def seen(tid, cpu, layer_name):
        return ThreadSample(tid=tid, pid=tid, comm=f"t{tid}", cpu=cpu, util=0.9, wait=0.0, policy=0, nice=0,
                            affinity=tuple(shape.cpus), layer=layer_name, sibling_busy=False)

    observation = Observation(at=0.0, machine_shape={}, layers=[], threads=[seen(50, 3, "app.hot"), seen(60, 3, None)],
                              psi=None, overhead=OverheadView(0.0, 0.0, 0.0, 1.0))
    owned = LayerPlan(layers=(hot(OWNED),), reserve_cpus=(0, 4))
    fenced = LayerPlan(layers=(hot(FENCED),), reserve_cpus=(0, 4))
    assert lint(owned, observation, shape, check_treatment=False) == []
    assert [(v.invariant, v.tid) for v in lint(fenced, observation, shape, check_treatment=False)] == [
        ("open_reserve", 60)]


def test_the_journal_and_the_plan_table_say_owned_or_fenced_for_exclusive_cpus_only():
    assert describe_layer(hot(OWNED)) == "exclusive, CPUs 3, owned"
    assert describe_layer(hot(FENCED)).endswith("CPUs 3, fenced")
    latency = Layer("app.io", OPEN, LATENCY, "critical", "app", "io", MemberSelector(), nice=-10)
    assert latency.holds_cpus is None and "owned" not in describe_layer(latency)
    assert treatment_text({"kind": CONFINED, "treatment": EXCLUSIVE, "ownership": OWNED, "cpus": [3]}) == \
        "exclusive (owned)"
    assert treatment_text({"kind": OPEN, "treatment": LATENCY, "ownership": None, "cpus": []}) == "latency"


GROUP = """
schema_version = 1
id = "svc"
[[thread_groups]]
name = "work"
thread_names = ["w*"]
treatment = "{treatment}"
ownership = "{ownership}"
"""


def test_a_profile_says_owned_or_fenced_for_an_exclusive_group_and_nothing_else():
    assert parse_profile(GROUP.format(treatment="exclusive", ownership="fenced"), "svc.toml").group("work").ownership == FENCED
    plain = GROUP.format(treatment="exclusive", ownership="x").replace('ownership = "x"\n', "")
    assert parse_profile(plain, "svc.toml").group("work").ownership == OWNED
    with pytest.raises(ConfigError) as bad:
        parse_profile(GROUP.format(treatment="exclusive", ownership="shared"), "svc.toml")
    assert "svc.toml" in str(bad.value) and "ownership" in str(bad.value) and "'owned'" in str(bad.value)
    with pytest.raises(ConfigError) as wrong:
        parse_profile(GROUP.format(treatment="latency", ownership="fenced"), "svc.toml")
    assert "applies only to treatment 'exclusive'" in str(wrong.value)
