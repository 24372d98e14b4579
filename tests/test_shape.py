"""Machine shape from sysfs: every fixture tree, the real host, cpulists and error reporting."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from fixture_shapes import FIXTURES_DIR, fixture_names, fixture_root, load_fixture_shape
from temperd.sources.shape import Core, ShapeError, format_cpulist, online_cpus, parse_cpulist, read_shape

M5_MODEL = "Intel(R) Xeon(R) Platinum 8175M CPU @ 2.50GHz"
C2_MODEL = "Intel(R) Xeon(R) CPU @ 3.10GHz"

# name -> (physical cores as sibling tuples, packages, model)
EXPECTED = {
    "this-host": ([(0,), (1,)], (0,), "AMD EPYC"),
    "aws-m5.xlarge": ([(0, 2), (1, 3)], (0,), M5_MODEL),
    "aws-m5.2xlarge": ([(0, 4), (1, 5), (2, 6), (3, 7)], (0,), M5_MODEL),
    "gcp-c2-standard-4": ([(0, 2), (1, 3)], (0,), C2_MODEL),
    "gcp-c2-standard-8": ([(0, 4), (1, 5), (2, 6), (3, 7)], (0,), C2_MODEL),
    "dual-socket-64c": ([(c, c + 64) for c in range(64)], (0, 1), "Intel(R) Xeon(R) Platinum 8358 CPU @ 2.60GHz"),
}


def test_every_fixture_tree_is_covered():
    assert set(fixture_names()) == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture_shape(name):
    cores, packages, model = EXPECTED[name]
    shape = load_fixture_shape(name)
    assert [c.cpus for c in shape.cores] == cores
    assert shape.cpus == tuple(sorted(cpu for core in cores for cpu in core))
    assert shape.n_cores == len(cores)
    assert shape.threads_per_core == max(len(c) for c in cores)
    assert shape.packages == packages
    assert shape.cpu_model == model
    assert shape.source == fixture_root(name)
    for core in cores:
        for cpu in core:
            assert shape.core_of(cpu).cpus == core
            assert shape.siblings(cpu) == tuple(c for c in core if c != cpu)
    keys = [c.core_key for c in shape.cores]
    assert len(set(keys)) == len(keys)


def test_m5_xlarge_siblings_pairs_across_halves():
    shape = load_fixture_shape("aws-m5.xlarge")
    assert shape.siblings(0) == (2,) and shape.siblings(3) == (1,)
    assert shape.core_of(0) == Core("0:0", 0, 0, (0, 2))
    assert shape.core_of(1) != shape.core_of(0)
    assert shape.describe() == f"2 cores x 2 threads (4 CPUs), 1 package, model {M5_MODEL}"


def test_dual_socket_core_ids_repeat_per_package():
    shape = load_fixture_shape("dual-socket-64c")
    # core_id 5 exists in both sockets: the cores stay distinct, keyed by package.
    assert shape.core_of(5).core_key == "0:5" and shape.core_of(37).core_key == "1:5"
    assert shape.core_of(5).cpus == (5, 69) and shape.core_of(37).cpus == (37, 101)
    assert shape.describe().startswith("64 cores x 2 threads (128 CPUs), 2 packages, model ")


def test_core_of_unknown_cpu_names_the_cpu():
    shape = load_fixture_shape("gcp-c2-standard-4")
    with pytest.raises(KeyError, match="CPU 9 is not an online CPU"):
        shape.core_of(9)


def test_real_host_agrees_with_the_kernel():
    if not os.path.isdir("/sys/devices/system/cpu"):
        pytest.skip("no /sys/devices/system/cpu on this host")
    shape = read_shape("/sys")
    with open("/sys/devices/system/cpu/online") as handle:
        assert shape.cpus == parse_cpulist(handle.read())
    assert set(os.sched_getaffinity(0)) <= set(shape.cpus)
    assert shape.n_cpus == os.sysconf("SC_NPROCESSORS_ONLN")
    assert sum(len(c.cpus) for c in shape.cores) == shape.n_cpus
    with open("/proc/cpuinfo") as handle:
        models = {line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")}
    if models:
        assert shape.cpu_model in {" ".join(m.split()) for m in models}
    for cpu in shape.cpus:
        path = f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list"
        with open(path) as handle:
            assert set(shape.core_of(cpu).cpus) == set(parse_cpulist(handle.read())) & set(shape.cpus)


def test_real_host_default_reads_proc_cpuinfo():
    if not os.path.isfile("/proc/cpuinfo"):
        pytest.skip("no /proc/cpuinfo on this host")
    assert read_shape("/sys").cpu_model == read_shape("/sys", cpuinfo_path="/proc/cpuinfo").cpu_model


@pytest.mark.parametrize("text, cpus", [
    ("0", (0,)),
    ("0-3", (0, 1, 2, 3)),
    ("0-3,8,10-11", (0, 1, 2, 3, 8, 10, 11)),
    ("0,2", (0, 2)),
    ("64-95,0-31\n", tuple(range(0, 32)) + tuple(range(64, 96))),
    ("", ()),
])
def test_parse_cpulist(text, cpus):
    assert parse_cpulist(text) == cpus


@pytest.mark.parametrize("cpus, text", [
    ((0, 1, 2, 3, 8, 10, 11), "0-3,8,10-11"),
    ((3, 1, 2), "1-3"),
    ((0, 2, 4), "0,2,4"),
    ((), ""),
])
def test_format_cpulist_round_trips(cpus, text):
    assert format_cpulist(cpus) == text
    assert parse_cpulist(format_cpulist(cpus)) == tuple(sorted(cpus))


@pytest.mark.parametrize("garbage", ["a-b", "0-", "3-1", "0,,2", "1 2", "-1"])
def test_parse_cpulist_rejects_garbage(garbage):
    with pytest.raises(ValueError, match="CPU list"):
        parse_cpulist(garbage)


@pytest.fixture
def tree(tmp_path):
    """A writable copy of the c2-standard-8 tree."""
    root = tmp_path / "sysfs"
    shutil.copytree(fixture_root("gcp-c2-standard-8"), root)
    return root


def test_offline_cpu_is_left_out(tree):
    (tree / "devices/system/cpu/online").write_text("0-6\n")
    shape = read_shape(str(tree))
    assert shape.cpus == tuple(range(7))
    assert shape.core_of(3).cpus == (3,)
    assert shape.siblings(3) == ()
    assert shape.threads_per_core == 2
    assert online_cpus(str(tree)) == tuple(range(7))


def test_numa_and_cache_dirs_are_not_read(tree):
    """No decision uses NUMA nodes or caches: a VM without them, or with garbage there, reads the same."""
    shutil.rmtree(tree / "devices/system/node")
    (tree / "devices/system/cpu/cpu6/cache/index3/level").write_text("L3\n")
    shape = read_shape(str(tree))
    assert shape.n_cores == 4 and shape.cpus == tuple(range(8))


def test_older_kernel_thread_siblings_list_only(tree):
    for cpu in range(8):
        os.remove(tree / f"devices/system/cpu/cpu{cpu}/topology/core_cpus_list")
    assert [c.cpus for c in read_shape(str(tree)).cores] == [(0, 4), (1, 5), (2, 6), (3, 7)]


def test_missing_cpuinfo_gives_unknown_model_but_explicit_missing_path_fails(tree):
    os.remove(tree / "cpuinfo")
    assert read_shape(str(tree)).cpu_model == "unknown"
    missing = str(tree / "nope" / "cpuinfo")
    with pytest.raises(ShapeError, match=f"{missing}: missing"):
        read_shape(str(tree), cpuinfo_path=missing)


def test_missing_required_file_names_the_path(tree):
    path = tree / "devices/system/cpu/cpu5/topology/core_id"
    os.remove(path)
    with pytest.raises(ShapeError) as info:
        read_shape(str(tree))
    assert str(info.value) == f"{path}: missing; expected the core id (an integer)"


def test_missing_online_list_names_the_path(tree):
    path = tree / "devices/system/cpu/online"
    os.remove(path)
    with pytest.raises(ShapeError, match=f"^{path}: missing; expected the list of online CPUs"):
        read_shape(str(tree))


def test_not_a_sysfs_root(tmp_path):
    with pytest.raises(ShapeError, match="devices/system/cpu: missing; expected the sysfs CPU directory"):
        read_shape(str(tmp_path))


@pytest.mark.parametrize("relpath, content, expected", [
    ("devices/system/cpu/cpu2/topology/physical_package_id", "zero", "expected the package id (an integer), found 'zero'"),
    ("devices/system/cpu/online", "0-x", "expected the list of online CPUs like '0-3', found '0-x'"),
    ("devices/system/cpu/cpu1/topology/core_cpus_list", "1;5", "expected the CPU list of this CPU's SMT siblings"),
    ("devices/system/cpu/cpu1/topology/core_cpus_list", "0,4", "expected a sibling list that contains CPU 1"),
])
def test_garbage_in_a_file(tree, relpath, content, expected):
    (tree / relpath).write_text(content + "\n")
    with pytest.raises(ShapeError) as info:
        read_shape(str(tree))
    message = str(info.value)
    assert message.startswith(str(tree / relpath) + ": ") and expected in message
    assert "\n" not in message


def test_inconsistent_core_ids_are_reported(tree):
    (tree / "devices/system/cpu/cpu4/topology/core_id").write_text("9\n")
    with pytest.raises(ShapeError, match="CPU 4 shares a core with CPUs 0,4 but reports package 0 core 9"):
        read_shape(str(tree))


def test_generator_reproduces_the_committed_trees(tmp_path):
    script = os.path.join(os.path.dirname(FIXTURES_DIR), "make_sysfs_fixtures.py")
    subprocess.run([sys.executable, script, str(tmp_path)], check=True, capture_output=True, timeout=60)
    for name in fixture_names():
        generated = _tree_files(tmp_path / name)
        committed = _tree_files(fixture_root(name))
        assert generated == committed, f"tests/fixtures/sysfs/{name} differs from what the generator writes"


def _tree_files(root) -> dict:
    out = {}
    for dirpath, _, files in os.walk(str(root)):
        for name in files:
            path = os.path.join(dirpath, name)
            with open(path) as handle:
                out[os.path.relpath(path, str(root))] = handle.read()
    return out
