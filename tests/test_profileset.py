"""Profile set resolution: override by id, machine-shape specificity, trust rules."""

import os

from fixture_shapes import load_fixture_shape

from temperd.config.profile import parse_profile
from temperd.config.profileset import HostShape, load_profile_files, load_profile_set, resolve


def profile_text(pid, shape="", group="workers"):
    return f"""
schema_version = 1
id = "{pid}"
{shape}
[[thread_groups]]
name = "{group}"
thread_names = ["w*"]
treatment = "latency"
"""


def builtin(pid="db"):
    return parse_profile(profile_text(pid, group="builtin"), f"builtin:{pid}.toml", builtin=True)


def write(dirpath, name, text, mode=0o644):
    path = os.path.join(dirpath, name)
    with open(path, "w") as handle:
        handle.write(text)
    os.chmod(path, mode)
    return path


def host(name):
    return HostShape.of(load_fixture_shape(name))


def test_file_profile_overrides_builtin_with_same_id(tmp_path):
    write(tmp_path, "db.toml", profile_text("db", group="fromfile"))
    files, problems = load_profile_files([str(tmp_path)])
    pset = resolve([builtin("db"), builtin("other")], files, host("gcp-c2-standard-8"), problems)
    assert pset.active["db"].thread_groups[0].name == "fromfile"
    assert pset.active["other"].builtin
    statuses = {(c.profile.source, c.status) for c in pset.candidates if c.profile.id == "db"}
    assert statuses == {(str(tmp_path / "db.toml"), "active"), ("builtin:db.toml", "overridden")}
    assert "file" in pset.reason_for("db")


def test_most_specific_matching_shape_wins(tmp_path):
    write(tmp_path, "a-generic.toml", profile_text("db", group="generic"))
    write(tmp_path, "b-four-cores.toml", profile_text("db", "[machine_shape]\ncores = 4", group="four"))
    write(tmp_path, "c-four-smt.toml", profile_text("db", "[machine_shape]\ncores = 4\nthreads_per_core = 2", group="foursmt"))
    files, problems = load_profile_files([str(tmp_path)])
    assert not problems
    on_c2_8 = resolve([builtin()], files, host("gcp-c2-standard-8"))
    assert on_c2_8.active["db"].thread_groups[0].name == "foursmt"
    on_m5_2x = resolve([builtin()], files, host("aws-m5.2xlarge"))
    assert on_m5_2x.active["db"].thread_groups[0].name == "foursmt"
    on_c2_4 = resolve([builtin()], files, host("gcp-c2-standard-4"))
    assert on_c2_4.active["db"].thread_groups[0].name == "generic"
    mismatches = [c for c in on_c2_4.candidates if c.status == "shape-mismatch"]
    assert len(mismatches) == 2 and all("host has 2" in c.reason for c in mismatches)


def test_64_core_host_does_not_receive_an_8_cpu_smt_tuned_file_profile(tmp_path):
    write(tmp_path, "db.toml", profile_text("db", "[machine_shape]\ncores = 4\nthreads_per_core = 2", group="tuned"))
    files, _ = load_profile_files([str(tmp_path)])
    pset = resolve([builtin()], files, host("dual-socket-64c"))
    assert pset.active["db"].builtin
    (skipped,) = [c for c in pset.candidates if c.status == "shape-mismatch"]
    assert skipped.reason == "not applied: tuned for 4 cores, host has 64"


def test_shape_mismatch_without_builtin_means_no_profile(tmp_path):
    write(tmp_path, "x.toml", profile_text("x", '[machine_shape]\ncpu_model = "*EPYC*"'))
    files, _ = load_profile_files([str(tmp_path)])
    pset = resolve([], files, host("gcp-c2-standard-8"))
    assert "x" not in pset.active
    assert "tuned for CPU model" in pset.candidates[0].reason


def test_two_files_with_same_id_and_shape_are_reported(tmp_path):
    write(tmp_path, "a.toml", profile_text("db", group="first"))
    write(tmp_path, "b.toml", profile_text("db", group="second"))
    files, _ = load_profile_files([str(tmp_path)])
    pset = resolve([], files, host("this-host"))
    assert pset.active["db"].thread_groups[0].name == "first"
    (problem,) = pset.problems
    assert problem.file.endswith("b.toml") and "already defined in" in problem.message


def test_untrusted_files_are_refused(tmp_path):
    write(tmp_path, "open.toml", profile_text("open"), mode=0o666)
    write(tmp_path, "fine.toml", profile_text("fine"))
    files, problems = load_profile_files([str(tmp_path)], require_trusted=True)
    assert [p.id for p in files] == ["fine"]
    assert "writable by others" in problems[0].message and problems[0].file.endswith("open.toml")
    os.chown(tmp_path / "fine.toml", 1000, 1000)
    files, problems = load_profile_files([str(tmp_path)], require_trusted=True)
    assert any("owned by uid 1000" in p.message for p in problems)


def test_bad_file_is_reported_and_good_files_still_load(tmp_path):
    write(tmp_path, "good.toml", profile_text("good"))
    write(tmp_path, "bad.toml", profile_text("bad").replace('"latency"', '"fast"'))
    pset = load_profile_set(host("this-host"), str(tmp_path))
    assert "good" in pset.active and "bad" not in pset.active
    (problem,) = pset.problems
    assert problem.key == "thread_groups[0].treatment" and problem.line == 8


def test_builtins_all_load_and_apply_to_every_fixture_shape():
    from fixture_shapes import fixture_names

    from temperd.config.profileset import load_builtin_profiles

    builtins = load_builtin_profiles()
    assert len(builtins) == 8
    for name in fixture_names():
        pset = resolve(builtins, [], host(name))
        assert len(pset.active) == 8
