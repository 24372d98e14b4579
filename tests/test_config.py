"""temperd.toml: strictly validated like profiles; defaults are documented, never guessed."""

import json

import pytest

from temperd.config.daemon_config import (CONFIG_SPEC, HTTP_SPEC, check_binding_profiles, config_from_document,
                                          load_config)
from temperd.config.tomlsource import parse_toml
from temperd.config.errors import ConfigError
from temperd.config.schema import json_schema

GOOD = """\
backend = "native"
reserve_cpus = 2

[http]
port = 9999

[tiers.critical]
weight = 2000

[[binding]]
unit = "memcached.service"
tier = "critical"
profile = "memcached"
cpus = 1.5

[[binding]]
cgroup = "/system.slice/batch.slice"
tier = "background"
"""


def problems(text):
    with pytest.raises(ConfigError) as info:
        config_from_document(parse_toml(text, "temperd.toml"))
    return [str(p) for p in info.value.problems]


def test_good_config():
    config = config_from_document(parse_toml(GOOD, "temperd.toml"))
    assert config.backend == "native" and config.reserve_cpus == 2 and config.http_port == 9999
    assert config.tier_weights == {"critical": 2000, "standard": 100, "background": 10}
    first, second = config.bindings
    assert (first.unit, first.tier, first.profile, first.cpus) == ("memcached.service", "critical", "memcached", 1.5)
    assert (second.cgroup, second.tier, second.cpus) == ("/system.slice/batch.slice", "background", None)


def test_defaults_when_file_is_absent(tmp_path):
    config = load_config(str(tmp_path))
    assert config.backend == "auto" and config.http_port == HTTP_SPEC.default_of("port") and config.bindings == ()
    assert config.profile_dir == str(tmp_path / "profiles.d")
    assert "absent" in config.source


def test_profile_dir_is_relative_to_the_config_dir(tmp_path):
    (tmp_path / "temperd.toml").write_text('profile_dir = "mine"\n')
    assert load_config(str(tmp_path)).profile_dir == str(tmp_path / "mine")


@pytest.mark.parametrize("text, expected", [
    ('backend = "fast"\n', "temperd.toml:1: backend: expected one of 'auto', 'scx', 'native', found 'fast'"),
    ('[scx]\ncrash_limit = 0\n', "temperd.toml:2: scx.crash_limit: expected a value with 1 <= value <= 100, found 0"),
    ('[scx]\nargs = "-v"\n', "temperd.toml:2: scx.args: expected an array of strings, found '-v'"),
    ('[http]\nport = 70000\n', "temperd.toml:2: http.port: expected a value with 0 <= value <= 65535, found 70000"),
    ('[tiers.gold]\nweight = 1\n', "temperd.toml:1: tiers.gold: unknown key; expected one of: background, critical, standard"),
    ('[[binding]]\nunit = "a.service"\ncgroup = "/x"\n', "temperd.toml:1: binding[0]: expected exactly one of unit, cgroup"),
    ('[[binding]]\ncgroup = "relative"\n', "temperd.toml:2: binding[0].cgroup: expected an absolute cgroup path starting with '/', found 'relative'"),
    ('[[binding]]\nunit = "a.service"\ncpus = 0\n', "temperd.toml:3: binding[0].cpus: expected a value with 0 < value <= 4096, found 0"),
    ('reserve_cpus = "one"\n', "temperd.toml:1: reserve_cpus: expected an integer, found 'one'"),
    ('colour = 1\n', "temperd.toml:1: colour: unknown key; expected one of:"),
    ('[tiers.critical]\nidle_resume_us = -2\n', "temperd.toml:2: tiers.critical.idle_resume_us: expected a value with -1 <= value <= 1e+06, found -2"),
])
def test_each_error_names_file_line_key_and_expectation(text, expected):
    found = problems(text)
    assert len(found) == 1 and found[0].startswith(expected), found


def test_binding_to_an_unknown_profile_is_reported():
    config = config_from_document(parse_toml(GOOD, "temperd.toml"))
    (problem,) = check_binding_profiles(config, {"redis"})
    assert problem.key == "binding[0].profile" and "found 'memcached'" in problem.message


def test_config_json_schema():
    schema = json_schema(CONFIG_SPEC)
    json.dumps(schema)
    assert schema["properties"]["backend"]["enum"] == ["auto", "scx", "native"]
    assert schema["properties"]["binding"]["items"]["additionalProperties"] is False


def test_the_owned_cpus_resume_bound_is_zero_for_critical_by_default_and_each_tier_may_set_it():
    defaults = config_from_document(parse_toml("", "temperd.toml")).tier_idle_resume_us
    assert defaults == {"critical": 0, "standard": -1, "background": -1}
    config = config_from_document(parse_toml("[tiers.critical]\nidle_resume_us = -1\n[tiers.standard]\nidle_resume_us = 20\n",
                                             "temperd.toml"))
    assert config.tier_idle_resume_us == {"critical": -1, "standard": 20, "background": -1}


def test_scan_interval_depends_on_process_events():
    defaults = config_from_document(parse_toml("", "temperd.toml"))
    assert defaults.scan_interval(events_active=True) == 120.0  # events keep the inventory current
    assert defaults.scan_interval(events_active=False) == 30.0  # scans are all there is
    mine = config_from_document(parse_toml("reconcile_interval_s = 10.0\nscan_interval_without_events_s = 5.0\n",
                                           "temperd.toml"))
    assert (mine.scan_interval(True), mine.scan_interval(False)) == (10.0, 5.0)
