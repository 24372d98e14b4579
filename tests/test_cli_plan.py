"""temperctl plan --dry-run and explain: the answer to "why is this thread treated so?", without a daemon."""

import json

from click.testing import CliRunner

from fixture_shapes import fixture_root
from temperctl.main import main

PROFILE = """schema_version = 1
id = "cli-demo"
[fingerprint]
process_names = ["tmpd-cli*"]
[[thread_groups]]
name = "hot"
thread_names = ["hot-*"]
treatment = "exclusive"
[[thread_groups]]
name = "rest"
catch_all = true
treatment = "yield"
"""


def config_dir(tmp_path):
    (tmp_path / "profiles.d").mkdir()
    (tmp_path / "profiles.d" / "cli-demo.toml").write_text(PROFILE)
    (tmp_path / "temperd.toml").write_text('[[binding]]\ncgroup = "/"\ntier = "background"\n')
    return str(tmp_path)


def run(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_plan_dry_run_shows_workload_layers_and_reasons(tmp_path, spawn):
    child = spawn("tmpd-cli1")
    child.wait_ready()
    hot = int(child.command("thread hot-0"))
    result = run("plan", "--dry-run", "--config", config_dir(tmp_path), "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    (workload,) = [w for w in data["workloads"] if w["profile_id"] == "cli-demo"]
    assert child.pid in workload["pids"] and workload["tier"] == "background"
    (layer,) = [l for l in data["plan"]["layers"] if l["group"] == "hot" and hot in l["selector"]["tids"]]
    assert layer["kind"] == "Confined" and layer["cpus"] == [1]
    assert any("one per member thread" in r for r in layer["reasons"])
    table = run("plan", "--dry-run", "--config", str(tmp_path))
    assert "Confined" in table.output and "reserve for everything else: CPUs 0" in table.output


def test_plan_dry_run_for_a_fixture_shape(tmp_path, spawn):
    child = spawn("tmpd-cli2")
    child.wait_ready()
    child.command("thread hot-0")
    data = json.loads(run("plan", "--dry-run", "--config", config_dir(tmp_path), "--sysfs",
                          fixture_root("gcp-c2-standard-8"), "--json").output)
    assert data["machine_shape"].startswith("4 cores x 2 threads")
    (layer,) = [l for l in data["plan"]["layers"] if l["group"] == "hot" and l["workload"].endswith(f"pid{child.pid}")]
    assert layer["cpus"] == [3] and layer["idle_siblings"] == [7]


def test_explain_thread_and_unmatched_process(tmp_path, spawn):
    child = spawn("tmpd-cli3")
    child.wait_ready()
    hot = int(child.command("thread hot-1"))
    out = run("explain", "--dry-run", str(hot), "--config", config_dir(tmp_path)).output
    assert f"process {child.pid} (tmpd-cli3)" in out
    assert "profile cli-demo: process name 'tmpd-cli3' matches 'tmpd-cli*'" in out
    assert "thread name 'hot-1' matches 'hot-*' of group hot" in out and "Confined" in out
    other = spawn("unrelated")
    other.wait_ready()
    data = json.loads(run("explain", "--dry-run", str(other.pid), "--config", str(tmp_path), "--json").output)
    assert data["workload"]["profile_id"] is None and data["workload"]["tier"] == "background"
    missing = run("explain", "--dry-run", "999999999", "--config", str(tmp_path))
    assert missing.exit_code == 1 and "no process or thread 999999999" in missing.output


def split_runner():
    """stdout and stderr apart (click < 8.2 needs asking; 8.2 always keeps them apart)."""
    try:
        return CliRunner(mix_stderr=False)
    except TypeError:
        return CliRunner()


def scx_config_dir(tmp_path, profile):
    (tmp_path / "profiles.d").mkdir()
    (tmp_path / "profiles.d" / "demo.toml").write_text(profile)
    return str(tmp_path)


def test_plan_backend_scx_prints_a_valid_scx_layered_config_for_a_fixture_shape(tmp_path, spawn):
    from temperd.backends.scx.validate import validate_config

    child = spawn("tmpd-cli3")
    child.wait_ready()
    child.command("thread hot-0")
    child.command("thread hot-1")
    result = split_runner().invoke(main, ["plan", "--backend", "scx", "--config",
                                                       scx_config_dir(tmp_path, PROFILE), "--shape",
                                                       fixture_root("gcp-c2-standard-8")])
    assert result.exit_code == 0, result.stderr
    config = json.loads(result.stdout)
    assert validate_config(config, cpu_count=8) == []
    (hot,) = [s for s in config if s["name"].endswith(".hot") and f"pid{child.pid}" in s["name"]]
    # 2 threads -> 2 whole cores of 2 siblings, owned by default: Grouped, so others borrow them,
    # on one CPU of each core (the siblings every layer's), with scx_layered allocating single CPUs
    assert hot["kind"]["Grouped"]["cpus_range"] == [2, 2]
    assert "runs with --allow-partial-core" in result.stderr
    assert {"TGIDEquals": child.pid} in hot["matches"][0] and {"CommPrefix": "hot-"} in hot["matches"][0]
    assert config[-1]["matches"] == [[]]
    assert "note: " in result.stderr and "CPU numbers become CPU counts" in result.stderr


def test_plan_backend_scx_names_what_cannot_be_expressed(tmp_path, spawn):
    groups = "".join(f'[[thread_groups]]\nname = "g{i}"\nthread_names = ["sg{i}x"]\ntreatment = "latency"\n'
                     for i in range(16))
    profile = f'schema_version = 1\nid = "wide"\n[fingerprint]\nprocess_names = ["tmpd-cli4"]\n{groups}'
    child = spawn("tmpd-cli4")
    child.wait_ready()
    for i in range(16):
        child.command(f"thread sg{i}x")
    result = split_runner().invoke(main, ["plan", "--backend", "scx", "--config",
                                                       scx_config_dir(tmp_path, profile)])
    assert result.exit_code == 1 and result.stdout == ""
    assert "error: cannot be expressed as a scx_layered config: 16 layers plus the catch-all exceed scx_layered's 16" \
        in result.stderr
