"""Profile schema v1: every class of validation error names file, key, line and expectation."""

import json
import textwrap

import pytest

from temperd.config.errors import ConfigError
from temperd.config.profile import parse_profile, profile_json_schema

GOOD = """\
schema_version = 1
id = "demo"
description = "a demo"

[fingerprint]
process_names = ["demo*"]
units = ["demo.service"]

[machine_shape]
cores = 4
threads_per_core = 2

[traits]
criticality = "performance"
cpu_bound = "compute"

[[thread_groups]]
name = "workers"
thread_names = ["worker-*"]
treatment = "exclusive"
cpu_fraction = 0.85

[[thread_groups]]
name = "io"
process_titles = ['^demo: io \\d+$']
treatment = "latency"
slice_us = 1000

[[thread_groups]]
name = "hot"
busiest = 2
treatment = "latency"

[[thread_groups]]
name = "rest"
catch_all = true
treatment = "yield"
"""


def problems_of(text):
    with pytest.raises(ConfigError) as info:
        parse_profile(textwrap.dedent(text), "demo.toml")
    return info.value.problems


def one_problem(text):
    problems = problems_of(text)
    assert len(problems) == 1, [str(p) for p in problems]
    return problems[0]


def replace(old, new):
    assert old in GOOD
    return GOOD.replace(old, new, 1)


def test_good_profile_parses_with_defaults():
    profile = parse_profile(GOOD, "demo.toml")
    assert profile.id == "demo"
    assert profile.machine_shape.cores == 4 and profile.machine_shape.specificity == 2
    workers, io, hot, rest = profile.thread_groups
    assert (workers.selector, workers.treatment, workers.cpu_fraction, workers.weight) == ("thread_names", "exclusive", 0.85, 1000)
    assert (io.selector, io.nice, io.slice_us) == ("process_titles", -10, 1000)
    assert (hot.selector, hot.busiest) == ("busiest", 2)
    assert (rest.selector, rest.yield_policy, rest.weight) == ("catch_all", "idle", 50)


def test_unknown_key_names_key_line_and_known_keys():
    p = one_problem(replace('cpu_fraction = 0.85', 'cpu_fraction = 0.85\ncolour = "red"'))
    assert p.key == "thread_groups[0].colour"
    assert p.line == 22
    assert "unknown key" in p.message and "cpu_fraction" in p.message
    assert str(p).startswith("demo.toml:22: thread_groups[0].colour:")


def test_unknown_top_level_table():
    p = one_problem(GOOD + "\n[extras]\nx = 1\n")
    assert p.key == "extras" and "unknown key" in p.message


def test_wrong_type():
    p = one_problem(replace("busiest = 2", 'busiest = "two"'))
    assert (p.key, p.line) == ("thread_groups[2].busiest", 31)
    assert "expected an integer, found 'two'" in p.message


def test_bool_is_not_an_integer():
    p = one_problem(replace("cores = 4", "cores = true"))
    assert p.key == "machine_shape.cores" and "found true" in p.message


def test_out_of_range():
    p = one_problem(replace("cpu_fraction = 0.85", "cpu_fraction = 1.5"))
    assert p.key == "thread_groups[0].cpu_fraction"
    assert "0 < value <= 1" in p.message and "1.5" in p.message


def test_zero_cpu_fraction_is_out_of_range():
    assert "0 < value" in one_problem(replace("cpu_fraction = 0.85", "cpu_fraction = 0")).message


def test_bad_choice():
    p = one_problem(replace('criticality = "performance"', 'criticality = "urgent"'))
    assert p.key == "traits.criticality" and "'performance', 'standard'" in p.message and p.line == 14


def test_duplicate_group_names():
    p = one_problem(replace('name = "io"', 'name = "workers"'))
    assert p.key == "thread_groups[1].name" and "duplicate group name 'workers'" in p.message
    assert p.line == 24


def test_bad_regex_pattern():
    p = one_problem(replace("'^demo: io \\d+$'", "'^demo: (io'"))
    assert p.key == "thread_groups[1].process_titles[0]" and "valid regular expression" in p.message


def test_bad_glob_pattern():
    p = one_problem(replace('["worker-*"]', '["worker-[0-9"]'))
    assert p.key == "thread_groups[0].thread_names[0]" and "balanced [ ]" in p.message


def test_thread_name_pattern_longer_than_comm_can_be():
    p = one_problem(replace('["worker-*"]', '["a_thread_name_of_20b*"]'))
    assert "at most 15 bytes" in p.message


def test_unsupported_schema_version_is_the_only_complaint():
    p = one_problem(replace("schema_version = 1", "schema_version = 2") + "\nwhatever = 1\n")
    assert (p.key, p.line) == ("schema_version", 1)
    assert p.message == "unsupported schema_version: expected 1, found 2"


def test_missing_required_keys():
    problems = problems_of('description = "nothing else"\n')
    assert {p.key for p in problems} == {"schema_version", "id", "thread_groups"}
    assert all("missing required key" in p.message for p in problems)


def test_invalid_toml_reports_line():
    p = one_problem(replace('id = "demo"', 'id = "demo'))
    assert p.line == 2 and "not valid TOML" in p.message


def test_exactly_one_selector():
    p = one_problem(replace("busiest = 2", "busiest = 2\nthread_names = ['x']"))
    assert p.key == "thread_groups[2]" and "found thread_names, busiest" in p.message
    p = one_problem(replace('thread_names = ["worker-*"]\n', ""))
    assert "found none" in p.message


def test_parameter_of_another_treatment():
    p = one_problem(replace('treatment = "yield"', 'treatment = "yield"\nslice_us = 500'))
    assert p.key == "thread_groups[3].slice_us" and "'exclusive' or 'latency'" in p.message


def test_at_most_one_catch_all():
    p = one_problem(replace("busiest = 2", "catch_all = true"))
    assert p.key == "thread_groups[3].catch_all" and "at most one catch_all" in p.message


def test_every_problem_is_reported_not_just_the_first():
    text = replace("cores = 4", "cores = 0").replace("cpu_fraction = 0.85", "cpu_fraction = 2.0")
    assert {p.key for p in problems_of(text)} == {"machine_shape.cores", "thread_groups[0].cpu_fraction"}


def test_json_schema_is_generated_from_the_same_model():
    schema = profile_json_schema()
    json.dumps(schema)
    assert schema["additionalProperties"] is False
    assert set(schema["required"]) == {"schema_version", "id", "thread_groups"}
    group = schema["properties"]["thread_groups"]["items"]
    assert group["additionalProperties"] is False
    assert group["properties"]["treatment"]["enum"] == ["exclusive", "latency", "yield"]
    assert group["properties"]["cpu_fraction"]["exclusiveMinimum"] == 0.0
    assert group["properties"]["nice"]["minimum"] == -20
