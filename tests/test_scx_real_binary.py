"""Every config temperd renders is accepted by the real scx_layered 1.1.2 (not the stand-in).

The golden configs (tests/fixtures/scx_golden/) and a config rendered for each builtin profile on
each fixture shape (tests/fixtures/sysfs/) go through the real binary twice: `--print-and-exit`
(it parses) and a normal start (the layer rule checks; on a kernel without sched_ext it then stops
at "kernel too old", which counts as accepted). See tests/real_scx_layered.py for where the binary
and the trixie glibc it needs come from; without them every test here skips and says why.
.ci/run provides both and runs this file on its own, where a skip is reported, not hidden.

The validator (`temperctl scx validate`) is stricter than scx_layered on purpose (unknown keys,
checks scx_layered makes only after attaching), never laxer: every corpus config the real binary
rejects, the validator rejects too, and the upstream examples pass both.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
from typing import Sequence

import pytest
from fixture_shapes import fixture_names, load_fixture_shape
from real_scx_layered import command_prefix, normal_start, normal_start_skip_reason, print_and_exit

from temperd.backends.scx.render import RenderError, render_plan
from temperd.backends.scx.validate import errors_of, validate_config, validate_file
from temperd.config.profileset import load_builtin_profiles
from temperd.decide.matcher import ThreadMatch, Workload
from temperd.decide.planner import plan
from temperd.plan import OWNERSHIPS

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
GOLDEN = sorted(glob.glob(os.path.join(FIXTURES, "scx_golden", "*.json")))
EXAMPLES = sorted(glob.glob(os.path.join(FIXTURES, "scx_examples", "*.json")))
BROKEN = sorted(glob.glob(os.path.join(FIXTURES, "scx_broken", "*.json")))
PROFILES = {p.id: p for p in load_builtin_profiles()}
SHAPES = fixture_names()
PREFIX, WHY_NOT = command_prefix()
needs_binary = pytest.mark.skipif(PREFIX is None, reason=f"real scx_layered cannot run here: {WHY_NOT}")
START_SKIP = normal_start_skip_reason()


def thread_name(group) -> str:
    """A thread name the group's selector takes: its first glob with the wildcards filled in."""
    if group.thread_names:
        return group.thread_names[0].replace("*", "1").replace("?", "1").replace("[", "").replace("]", "")[:15]
    return "worker"


def builtin_workload(profile, budget: float, pid: int = 5000) -> Workload:
    threads, tid = [], pid
    for group in profile.thread_groups:
        for _ in range(3):
            threads.append(ThreadMatch(tid, pid, thread_name(group), group.name, "real-binary test"))
            tid += 1
    unit = f"{profile.id}.service"
    return Workload(key=unit, profile_id=profile.id, tier="critical", budget=budget, budget_reason="binding cpus",
                    source="binding", reason="real-binary test", unit=unit, cgroup=f"/system.slice/{unit}",
                    pids=(pid,), threads=tuple(threads))


def rendered_config(shape_name: str, profile_id: str, ownership: str):
    """The profile planned on the shape with the largest budget that plans without errors, its
    exclusive layers owned or fenced."""
    shape = load_fixture_shape(shape_name)
    profile = PROFILES[profile_id]
    for budget in sorted({max(1.0, float(b)) for b in (shape.n_cores // 2, shape.n_cores // 4, 2, 1)},
                         reverse=True):
        layer_plan = plan(shape, [builtin_workload(profile, budget)], {profile_id: profile})
        if layer_plan.errors:
            continue
        layer_plan = dataclasses.replace(layer_plan, layers=tuple(
            dataclasses.replace(l, ownership=ownership) for l in layer_plan.layers))
        try:
            rendered = render_plan(layer_plan, shape.n_cpus)
            return rendered.config, shape.n_cpus, rendered.options
        except RenderError:
            continue
    pytest.fail(f"{profile_id} cannot be planned and rendered on {shape_name} with any budget tried")


def assert_accepted(path: str, options: Sequence[str] = ()) -> None:
    """Accepted with the options it was rendered for (--allow-partial-core)."""
    parsed = print_and_exit(PREFIX, path, options=options)
    assert parsed.accepted, f"scx_layered --print-and-exit rejected {path} (exit {parsed.code}): {parsed.message}"
    if START_SKIP is None:
        started = normal_start(PREFIX, path, options=options)
        assert started.accepted, f"scx_layered rejected {path} at start (exit {started.code}): {started.message}"


def rejected_by_binary(path: str) -> bool:
    if not print_and_exit(PREFIX, path).accepted:
        return True
    return START_SKIP is None and not normal_start(PREFIX, path).accepted


def test_the_real_binary_runs_where_required():
    """.ci/run sets TEMPERD_SCX_REQUIRE=1 when it has the binary: then a skip would hide a failure.
    Where a command prefix is found, it runs the real binary: a golden config parses through it."""
    if PREFIX is None:
        assert os.environ.get("TEMPERD_SCX_REQUIRE") != "1", f"real scx_layered cannot run here: {WHY_NOT}"
        pytest.skip(f"real scx_layered cannot run here: {WHY_NOT}")
    parsed = print_and_exit(PREFIX, GOLDEN[0])
    assert parsed.accepted, f"{' '.join(PREFIX)} does not run scx_layered (exit {parsed.code}): {parsed.message}"


def test_goldens_are_there():
    assert len(GOLDEN) >= 12 and len(SHAPES) >= 5 and len(PROFILES) >= 8


@needs_binary
@pytest.mark.parametrize("path", GOLDEN, ids=os.path.basename)
def test_golden_config_is_accepted_by_the_real_scx_layered(path):
    assert_accepted(path)


@needs_binary
@pytest.mark.parametrize("ownership", OWNERSHIPS)
@pytest.mark.parametrize("profile_id", sorted(PROFILES))
@pytest.mark.parametrize("shape_name", SHAPES)
def test_builtin_profile_rendered_on_fixture_shape_is_accepted_by_the_real_scx_layered(shape_name, profile_id, ownership,
                                                                                        tmp_path):
    config, cpus, options = rendered_config(shape_name, profile_id, ownership)
    assert validate_config(config, cpu_count=cpus) == []
    path = tmp_path / f"{shape_name}--{profile_id}--{ownership}.json"
    path.write_text(json.dumps(config, indent=2) + "\n")
    assert_accepted(str(path), options)


@needs_binary
@pytest.mark.parametrize("path", EXAMPLES, ids=os.path.basename)
def test_upstream_example_passes_both(path):
    assert validate_file(path) == []
    assert_accepted(path)


@needs_binary
@pytest.mark.parametrize("path", BROKEN, ids=os.path.basename)
def test_what_the_real_binary_rejects_the_validator_rejects(path):
    if rejected_by_binary(path):
        assert errors_of(validate_file(path, cpu_count=8)), f"scx_layered rejects {path}, the validator passes it"


@needs_binary
def test_the_check_catches_a_rejected_config(tmp_path):
    """Not vacuous: a golden config spoilt the way a renderer bug would (a catch-all layer that is
    not last) is rejected by the real binary, and assert_accepted fails on it."""
    config = json.loads(open(GOLDEN[0]).read())
    config[-1]["matches"] = [[{"CommPrefix": "x"}]]
    bad = tmp_path / "terminal-not-catch-all.json"
    bad.write_text(json.dumps(config))
    if START_SKIP is None:
        assert not normal_start(PREFIX, str(bad)).accepted
    unparsable = tmp_path / "overload-kind.json"
    config[-1] = {"name": "rest", "matches": [[]], "kind": {"Overload": {}}}
    unparsable.write_text(json.dumps(config))
    assert not print_and_exit(PREFIX, str(unparsable)).accepted
    with pytest.raises(AssertionError, match="rejected"):
        assert_accepted(str(unparsable))
