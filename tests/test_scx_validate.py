"""The scx_layered config validator: upstream examples pass, each broken config fails on its rule."""

import copy
import glob
import json
import os

import pytest
from click.testing import CliRunner

from temperctl.scx_cmd import scx
from temperd.backends.scx.checks.problems import ERROR, RULES, WARNING
from temperd.backends.scx.validate import validate_config, validate_file

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
EXAMPLES = sorted(glob.glob(os.path.join(FIXTURES, "scx_examples", "*.json")))
BROKEN = sorted(glob.glob(os.path.join(FIXTURES, "scx_broken", "*.json")))
CORPUS_CPUS = 8  # the broken corpus is checked as if for an 8-CPU host (cpus-range-host needs one)


def rule_of(path):
    """tests/fixtures/scx_broken/RULE[--variant].json"""
    return os.path.basename(path)[: -len(".json")].split("--")[0]


def base():
    return [
        {"name": "app", "matches": [[{"CgroupPrefix": "system.slice/app.service/"}, {"CommPrefix": "worker"}]],
         "kind": {"Confined": {"util_range": [0.5, 0.9], "cpus_range": [2, 2]}}},
        {"name": "rest", "matches": [[]], "kind": {"Open": {}}},
    ]


def with_kind(kind, **fields):
    config = base()
    body = dict(fields)
    if kind != "Open":
        body.setdefault("util_range", [0.5, 0.9])
    config[0]["kind"] = {kind: body}
    return config


def with_matches(matches):
    config = base()
    config[0]["matches"] = matches
    return config


def errors(problems):
    return [p for p in problems if p.severity == ERROR]


def test_fixtures_are_there():
    assert len(EXAMPLES) == 5, "tests/fixtures/scx_examples holds the upstream examples"
    assert len(BROKEN) >= 40


@pytest.mark.parametrize("path", EXAMPLES, ids=os.path.basename)
def test_upstream_example_validates(path):
    assert validate_file(path) == []


def test_spec_minimal_config_validates():
    config = [
        {"name": "batch", "matches": [[{"CgroupPrefix": "system.slice/"}]],
         "kind": {"Confined": {"util_range": [0.8, 0.9], "cpus_range": [1, 4]}}},
        {"name": "web", "matches": [[{"PcommPrefix": "nginx"}]], "kind": {"Grouped": {"util_range": [0.5, 0.7]}}},
        {"name": "rest", "matches": [[]], "kind": {"Open": {}}},
    ]
    assert validate_config(config, cpu_count=4) == []


@pytest.mark.parametrize("path", BROKEN, ids=os.path.basename)
def test_broken_config_fails_on_its_rule(path):
    rule = rule_of(path)
    assert rule in RULES, f"{path}: no rule {rule!r}"
    found = errors(validate_file(path, cpu_count=CORPUS_CPUS))
    assert found, f"{path} should be invalid"
    assert {p.rule for p in found} == {rule}, [p.line(path) for p in found]
    for problem in found:
        line = problem.line(os.path.basename(path))
        assert line.startswith(os.path.basename(path) + ": ") and line.endswith(f"[{rule}]")


# Rules that only ever warn (scx_layered accepts the config), each checked below.
WARNING_CASES = {
    "deprecated-key": with_kind("Open", idle_smt=True),
    "match-all-block": with_matches([[{"CommPrefix": "a"}], []]),
    "cgroup-path": with_matches([[{"CgroupPrefix": "/system.slice/"}], [{"CgroupSuffix": "app.service"}]]),
    "iskthread-value": with_matches([[{"IsKthread": False}]]),
    "gpu-support": with_matches([[{"UsedGpuPid": True}]]),
    "growth-algo-risky": with_kind("Confined", cpus_range=[1, 2], growth_algo="StickyDynamic"),
    "xnuma-threshold": with_kind("Open", xnuma_threshold=[0.9, 0.5]),
    "preempt-overrides": with_kind("Open", preempt=True, disallow_open_after_us=1000),
    "membw": with_kind("Grouped", membw_gb=2.5),
    "open-weight": with_kind("Open", weight=1),
    "preempt-first-alone": with_kind("Open", preempt_first=True),
    "template-startup": [dict(base()[0], template={"CgroupSuffix": "app.scope/"}), base()[1]],
}


@pytest.mark.parametrize("rule", sorted(WARNING_CASES))
def test_warning_rule(rule):
    problems = validate_config(WARNING_CASES[rule])
    assert errors(problems) == []
    assert {p.rule for p in problems} == {rule} and all(p.severity == WARNING for p in problems)
    assert ": warning: " in problems[0].line("f.json")


def test_every_rule_has_a_broken_config_or_a_warning_case():
    covered = {rule_of(p) for p in BROKEN} | set(WARNING_CASES)
    assert covered == set(RULES) - {"file-read"}


def test_gpu_matches_are_fine_with_gpu_support():
    assert validate_config(WARNING_CASES["gpu-support"], gpu_support=True) == []


def test_types_are_strict_like_serde():
    # f64 fields take integers; Option fields take null; u64 fields take no booleans.
    assert validate_config(with_kind("Grouped", util_range=[0, 2], cpus_range=None, disallow_open_after_us=None)) == []
    assert [p.rule for p in validate_config(with_kind("Open", slice_us=True))] == ["field-type"]
    assert [p.rule for p in validate_config(with_kind("Open", weight=None))] == ["field-type"]
    assert [p.rule for p in validate_config(with_kind("Open", nodes=[0, -1]))] == ["field-type"]
    assert [p.rule for p in validate_config(with_matches([[{"NSPIDEquals": [4026531836, 1.0]}]]))] == ["match-value"]
    assert validate_config(with_matches([[{"NSPIDEquals": [4026531836, 1]}]])) == []


def test_limits_are_inclusive():
    config = base()
    config[0]["name"] = "n" * 63
    config[0]["matches"] = [[{"TGIDEquals": i}] for i in range(32)]
    assert validate_config(config) == []
    config[0]["matches"] = [[{"NiceAbove": -20}] * 26, [{"CommPrefix": "x" * 15}]]
    assert validate_config(config) == []
    many = [dict(copy.deepcopy(base()[0]), name=f"l{i}") for i in range(15)] + [base()[1]]
    assert validate_config(many) == []


def test_cpu_count_bound():
    assert validate_config(with_kind("Confined", cpus_range=[8, 8]), cpu_count=8) == []
    assert [p.rule for p in validate_config(with_kind("Confined", cpus_range=[8, 9]), cpu_count=8)] == ["cpus-range-host"]


def test_hint_block_may_hold_one_threshold_each():
    block = [{"HintEquals": 5}, {"SystemCpuUtilBelow": 0.5}, {"DsqInsertBelow": 0.25}]
    assert validate_config(with_matches([block])) == []
    assert [p.rule for p in validate_config(with_matches([block + [{"DsqInsertBelow": 0.1}]]))] == ["hint-block"]


def test_hint_value_may_repeat_within_one_layer():
    assert validate_config(with_matches([[{"HintEquals": 9}], [{"HintEquals": 9}]])) == []


def test_problem_line_names_file_place_expectation_and_rule():
    (problem,) = validate_config(with_kind("Confined", util_range=[0.9, 0.5]))
    assert problem.line("cfg.json") == ("cfg.json: layer[0] (app) .kind.Confined.util_range: "
                                        "expected [lo, hi] with 0 <= lo < hi, found [0.9, 0.5] [util-range]")


# ---- temperctl scx validate --------------------------------------------------------------------------

def test_cli_valid_files_exit_0():
    result = CliRunner().invoke(scx, ["validate", *EXAMPLES])
    assert result.exit_code == 0, result.output
    assert result.output.count(": ok") == len(EXAMPLES)


def test_cli_invalid_file_exit_1_one_line_per_problem(tmp_path):
    config = with_kind("Confined", util_range=[0.9, 0.5], cpus_pct=[0.1, 0.2])
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(config))
    result = CliRunner().invoke(scx, ["validate", str(path), EXAMPLES[0]])
    assert result.exit_code == 1
    lines = result.output.splitlines()
    assert f"{path}: layer[0] (app) .kind.Confined.cpus_pct: expected 'cpus_range_frac', found the old name 'cpus_pct' " \
           "(scx_layered ignores it silently) [renamed-key]" in lines
    assert any(l.startswith(f"{path}: layer[0] (app) .kind.Confined.util_range: expected") for l in lines)
    assert f"{EXAMPLES[0]}: ok" in lines and len(lines) == 3


def test_cli_reads_stdin_and_checks_cpus():
    text = json.dumps(with_kind("Confined", cpus_range=[4, 4]))
    assert CliRunner().invoke(scx, ["validate", "--cpus", "4", "-"], input=text).exit_code == 0
    result = CliRunner().invoke(scx, ["validate", "--cpus", "2", "-"], input=text)
    assert result.exit_code == 1 and "<stdin>: layer[0] (app) .kind.Confined.cpus_range: expected max <= 2" in result.output


def test_cli_warnings_do_not_fail():
    result = CliRunner().invoke(scx, ["validate", "-"], input=json.dumps(WARNING_CASES["deprecated-key"]))
    assert result.exit_code == 0 and "warning: idle_smt is deprecated" in result.output and "ok (1 warning)" in result.output


def test_cli_usage_errors_exit_2(tmp_path):
    assert CliRunner().invoke(scx, ["validate"]).exit_code == 2
    assert CliRunner().invoke(scx, ["validate", str(tmp_path / "missing.json")]).exit_code == 2


def test_cli_detect_says_why(tmp_path):
    result = CliRunner().invoke(scx, ["detect", "--sysfs", str(tmp_path), "--json"])
    assert result.exit_code == 1
    assert json.loads(result.output)["reason"] == f"no {tmp_path}/kernel/sched_ext: kernel without CONFIG_SCHED_CLASS_EXT"
    result = CliRunner().invoke(scx, ["detect", "--sysfs", str(tmp_path)])
    assert "usable:      no: no " in result.output
