"""temperctl profiles: list, show, validate, schema — as a user runs them (no daemon)."""

import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from fixture_shapes import fixture_root
from temperctl.main import main

BUILTINS = {"mysql-innodb", "postgresql", "redis", "memcached", "pytorch-training", "onnx-inference",
            "llama-cpp", "jvm-service"}

GOOD = """schema_version = 1
id = "my-service"
[fingerprint]
units = ["my.service"]
[[thread_groups]]
name = "workers"
thread_names = ["worker-*"]
treatment = "exclusive"
"""


def run(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_list_shows_the_eight_builtins_with_their_source(tmp_path):
    result = run("profiles", "list", "--dir", str(tmp_path))
    assert result.exit_code == 0, result.output
    for pid in BUILTINS:
        assert f"builtin:{pid}.toml" in result.output
    data = json.loads(run("profiles", "list", "--dir", str(tmp_path), "--json").output)
    assert {p["id"] for p in data["profiles"]} == BUILTINS
    assert all(p["status"] == "active" and p["source"].startswith("builtin:") for p in data["profiles"])


@pytest.mark.skipif(os.geteuid() != 0, reason="profiles in --dir load only when they are root's, as the daemon's do")
def test_list_shows_a_file_override_and_a_shape_mismatch(tmp_path):
    (tmp_path / "redis.toml").write_text(GOOD.replace("my-service", "redis"))
    (tmp_path / "big.toml").write_text(GOOD.replace("my-service", "big") + "[machine_shape]\ncores = 64\n")
    data = json.loads(run("profiles", "list", "--dir", str(tmp_path), "--sysfs", fixture_root("gcp-c2-standard-8"), "--json").output)
    status = {(p["id"], p["source"].startswith("builtin:")): (p["status"], p["reason"]) for p in data["profiles"]}
    assert status[("redis", False)][0] == "active"
    assert status[("redis", True)][0] == "overridden"
    assert status[("big", False)] == ("shape-mismatch", "not applied: tuned for 64 cores, host has 4")
    assert data["host_shape"]["cores"] == 4


def test_show_mysql_innodb_prints_groups_and_treatments(tmp_path):
    result = run("profiles", "show", "mysql-innodb", "--dir", str(tmp_path))
    assert result.exit_code == 0, result.output
    assert "id:           mysql-innodb" in result.output
    lines = result.output.splitlines()
    row = next(line for line in lines if line.startswith("connections"))
    assert "one_connection" in row and "exclusive" in row
    assert any(line.startswith("innodb-io") and "latency" in line for line in lines)
    assert any("all other threads" in line and "yield" in line for line in lines)


def test_show_unknown_profile_is_an_error(tmp_path):
    result = run("profiles", "show", "nope", "--dir", str(tmp_path))
    assert result.exit_code == 1 and "no builtin or file profile has this id" in result.output


def test_validate_directory_with_one_good_and_several_bad_files(tmp_path):
    (tmp_path / "good.toml").write_text(GOOD)
    (tmp_path / "typo.toml").write_text(GOOD.replace('treatment = "exclusive"', 'treatmnet = "exclusive"'))
    (tmp_path / "range.toml").write_text(GOOD.replace("my-service", "r") + "cpu_fraction = 3.0\n")
    (tmp_path / "syntax.toml").write_text(GOOD.replace('id = "my-service"', 'id = my-service'))
    (tmp_path / "version.toml").write_text(GOOD.replace("schema_version = 1", "schema_version = 7"))
    result = run("profiles", "validate", str(tmp_path))
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert f"ok: {tmp_path}/good.toml (id my-service)" in lines
    errors = [l for l in lines if l.startswith("error: ")]
    assert f"error: {tmp_path}/range.toml:9: thread_groups[0].cpu_fraction: expected a value with 0 < value <= 1, found 3.0" in errors
    assert f"error: {tmp_path}/version.toml:1: schema_version: unsupported schema_version: expected 1, found 7" in errors
    assert any(l.startswith(f"error: {tmp_path}/syntax.toml:2: (top level): not valid TOML") for l in errors)
    typo = [l for l in errors if "typo.toml" in l]
    assert any(l.startswith(f"error: {tmp_path}/typo.toml:8: thread_groups[0].treatmnet: unknown key; expected one of:") for l in typo)
    assert any("typo.toml:5: thread_groups[0].treatment: missing required key" in l for l in typo)
    assert len(errors) == 5


def test_validate_good_files_exits_0_and_missing_path_is_usage(tmp_path):
    (tmp_path / "good.toml").write_text(GOOD)
    assert run("profiles", "validate", str(tmp_path / "good.toml")).exit_code == 0
    assert run("profiles", "validate", str(tmp_path / "absent.toml")).exit_code == 2


def test_schema_is_json_schema():
    schema = json.loads(run("profiles", "schema").output)
    assert schema["$schema"].startswith("https://json-schema.org/")
    assert "thread_groups" in schema["properties"]


def test_installed_temperctl_entry_point_runs():
    bindir = os.path.dirname(sys.executable)
    out = subprocess.run([os.path.join(bindir, "temperctl"), "--help"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and "profiles" in out.stdout
