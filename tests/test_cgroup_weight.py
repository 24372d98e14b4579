"""Tier weights: which way this host allows (and why not), systemd and cgroupfs paths, restore,
drift, and recovery after a crash. The cgroupfs path runs on scratch files everywhere and on a
scratch cgroup where the host's cgroup2 hierarchy carries the cpu controller; the systemd path
runs against a stand-in systemctl everywhere and on a transient unit where systemd is PID 1."""

from __future__ import annotations

import os
import subprocess

import pytest

from temperd.backends.native.backend import NativeBackend
from temperd.backends.native.cgroup_weight import (CGROUPFS, CPU_WEIGHT, SYSTEMD, CgroupWeights, WeightSupport,
                                                   detect)
from temperd.backends.native.pmqos import PmQos
from temperd.plan import CgroupWeight, LayerPlan

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="writing cgroup weights needs root")


def _host_facts():
    """What decides the method, read here without the module under test."""
    try:
        with open("/proc/1/comm") as handle:
            init = handle.read().strip()
    except OSError:
        init = "unknown"
    systemd = init == "systemd" and os.path.isdir("/run/systemd/system")
    mount = None
    with open("/proc/self/mountinfo") as handle:
        for line in handle:
            left, _, right = line.partition(" - ")
            if right.split()[:1] == ["cgroup2"]:
                mount = left.split()[4]
                break
    controllers = []
    if mount:
        with open(os.path.join(mount, "cgroup.controllers")) as handle:
            controllers = handle.read().split()
    return systemd, mount, controllers, init


def test_this_host_support_is_what_the_host_shows():
    systemd, mount, controllers, init = _host_facts()
    support = detect()
    assert support.cgroup2_mount == mount
    if systemd:
        assert support.method == SYSTEMD
        assert "systemctl set-property --runtime" in support.reason
    elif mount is None:
        assert support.method is None
        assert f"no cgroup2 hierarchy is mounted, and PID 1 is {init!r}" in support.reason
    elif "cpu" not in controllers:
        # e.g. a hybrid host without systemd: cgroup2 mounted, but the cpu controller bound to v1
        assert support.method is None
        assert f"the cgroup2 hierarchy at {mount} has no cpu controller" in support.reason
    else:
        assert support.method == CGROUPFS
        assert f"cpu.weight is written under {mount}" in support.reason


def _fake_root(tmp_path, procs_pid1="init", controllers="cpu memory", systemd_dir=False):
    proc = tmp_path / "proc"
    (proc / "1").mkdir(parents=True)
    (proc / "1" / "comm").write_text(procs_pid1 + "\n")
    (proc / "self").mkdir()
    cg = tmp_path / "cg"
    cg.mkdir()
    (cg / "cgroup.controllers").write_text(controllers + "\n")
    (proc / "self" / "mountinfo").write_text(
        f"30 23 0:26 / {cg} rw,nosuid - cgroup2 cgroup2 rw\n"
        f"31 23 0:27 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n")
    run = tmp_path / "run"
    run.mkdir()
    if systemd_dir:
        (run / "systemd" / "system").mkdir(parents=True)
    return str(proc), str(run), cg


def test_detect_hybrid_without_cpu_controller_says_why(tmp_path):
    proc, run, cg = _fake_root(tmp_path, controllers="hugetlb")
    support = detect(proc, run)
    assert support.method is None
    assert f"cgroup2 hierarchy at {cg} has no cpu controller (controllers: hugetlb)" in support.reason
    assert "cpu is bound to the cgroup v1 hierarchy at /sys/fs/cgroup/cpu" in support.reason
    assert "PID 1 is 'init', not systemd" in support.reason
    result = CgroupWeights(support).apply([CgroupWeight("db", "critical", 1000, cgroup="/db")])
    assert result.applied == {} and "unsupported" in result.unsupported[0]


def test_detect_systemd(tmp_path):
    proc, run, _cg = _fake_root(tmp_path, procs_pid1="systemd", systemd_dir=True)
    assert detect(proc, run).method == SYSTEMD


def test_cgroupfs_write_restore_and_drift(tmp_path):
    proc, run, cg = _fake_root(tmp_path)
    support = detect(proc, run)
    assert support.method == CGROUPFS
    (cg / "db").mkdir()
    (cg / "db" / "cpu.weight").write_text("100\n")
    (cg / "batch").mkdir()
    (cg / "batch" / "cpu.weight").write_text("100\n")
    weights = CgroupWeights(support)
    plan = [CgroupWeight("db", "critical", 1000, cgroup="/db"), CgroupWeight("batch", "background", 10, cgroup="/batch"),
            CgroupWeight("nocg", "standard", 100, cgroup="/missing")]
    result = weights.apply(plan)
    assert result.applied == {CPU_WEIGHT: 2} and not result.failed
    assert (cg / "db" / "cpu.weight").read_text() == "1000"
    assert any("does not exist" in u and "subtree_control" in u for u in result.unsupported)
    (cg / "batch" / "cpu.weight").write_text("50")  # someone else
    again = weights.apply(plan)
    assert again.drift == {CPU_WEIGHT: 1} and again.applied == {}
    done = weights.restore_all()
    assert done.restored == {CPU_WEIGHT: 1}
    assert (cg / "db" / "cpu.weight").read_text() == "100"
    assert (cg / "batch" / "cpu.weight").read_text() == "50"


def test_systemd_path_asks_systemctl_and_restores_default():
    calls = []
    state = {"CPUWeight": "[not set]"}

    def run(argv):
        calls.append(list(argv))
        if argv[1] == "show":
            return 0, state["CPUWeight"] + "\n", ""
        if argv[1] == "set-property":
            state["CPUWeight"] = argv[4].split("=", 1)[1] or "[not set]"
            return 0, "", ""
        return 1, "", "unexpected"

    weights = CgroupWeights(WeightSupport(SYSTEMD, "/sys/fs/cgroup", "systemd is PID 1"), run=run)
    result = weights.apply([CgroupWeight("db", "critical", 1000, cgroup="/system.slice/postgresql.service")])
    assert result.applied == {CPU_WEIGHT: 1}
    assert ["systemctl", "set-property", "--runtime", "postgresql.service", "CPUWeight=1000"] in calls
    assert weights.restore_all().restored == {CPU_WEIGHT: 1}
    assert calls[-1] == ["systemctl", "set-property", "--runtime", "postgresql.service", "CPUWeight="]
    assert state["CPUWeight"] == "[not set]"


def _weight_file(cg, name, value="100"):
    (cg / name).mkdir()
    (cg / name / "cpu.weight").write_text(value + "\n")
    return cg / name / "cpu.weight"


def _plan(*weights):
    return LayerPlan(layers=(), reserve_cpus=(0,), cgroup_weights=tuple(weights))


def test_cgroupfs_weight_is_undone_by_the_next_start_after_a_crash(tmp_path):
    proc, run, cg = _fake_root(tmp_path)
    support = detect(proc, run)
    db = _weight_file(cg, "db", "80")
    state = tmp_path / "state"

    def backend():
        return NativeBackend(str(state), weights=CgroupWeights(support), pmqos=PmQos(str(tmp_path / "no-sysfs")),
                             autogroup=False)

    crashed = backend()
    result = crashed.apply(_plan(CgroupWeight("db", "critical", 1000, cgroup="/db")), [])
    assert result.applied == {CPU_WEIGHT: 1}, result.errors
    assert db.read_text() == "1000"
    assert (state / "native-state.json").exists()  # dropped without stop(), as a kill would leave it
    fresh = backend()
    recovered = fresh.recover()
    assert recovered.restored == {CPU_WEIGHT: 1} and not recovered.failed, recovered.errors
    assert db.read_text() == "80"
    assert not (state / "native-state.json").exists()


def test_cgroupfs_weight_changed_after_a_crash_is_left_as_found(tmp_path):
    proc, run, cg = _fake_root(tmp_path)
    support = detect(proc, run)
    db = _weight_file(cg, "db")
    crashed = CgroupWeights(support)
    crashed.apply([CgroupWeight("db", "critical", 1000, cgroup="/db")])
    db.write_text("300")  # an operator, while temperd was down
    fresh = CgroupWeights(support)
    fresh.adopt_state(crashed.state())
    done = fresh.restore_all()
    assert (done.restored, done.drift) == ({}, {CPU_WEIGHT: 1})
    assert db.read_text() == "300"


def test_a_new_weight_keeps_the_first_original(tmp_path):
    proc, run, cg = _fake_root(tmp_path)
    weights = CgroupWeights(detect(proc, run))
    db = _weight_file(cg, "db", "80")
    weights.apply([CgroupWeight("db", "critical", 1000, cgroup="/db")])
    assert weights.apply([CgroupWeight("db", "standard", 500, cgroup="/db")]).applied == {CPU_WEIGHT: 1}  # a new plan
    assert db.read_text() == "500"
    assert weights.restore_all().restored == {CPU_WEIGHT: 1}
    assert db.read_text() == "80"  # the weight before temperd, not temperd's earlier one


def test_cgroup_removed_while_held_is_forgotten_without_error(tmp_path):
    proc, run, cg = _fake_root(tmp_path)
    support = detect(proc, run)
    db = _weight_file(cg, "db")
    weights = CgroupWeights(support)
    assert weights.apply([CgroupWeight("db", "critical", 1000, cgroup="/db")]).applied == {CPU_WEIGHT: 1}
    db.unlink()  # the workload's cgroup went away with it
    done = weights.restore_all()
    assert (done.restored, done.failed, done.errors) == ({}, {}, [])
    assert not weights.written and not db.exists()


def _systemctl_stand_in(state):
    """A systemctl that keeps unit properties in `state`: {unit: CPUWeight text}."""
    calls = []

    def run(argv):
        calls.append(list(argv))
        if argv[1] == "show":
            return 0, state.get(argv[-1], "[not set]") + "\n", ""
        if argv[1] == "set-property":
            state[argv[3]] = argv[4].split("=", 1)[1] or "[not set]"
            return 0, "", ""
        return 1, "", "unexpected"

    return run, calls


def test_systemd_weight_drift_and_recovery_through_systemctl():
    units = {"web.service": "200"}
    run, calls = _systemctl_stand_in(units)
    support = WeightSupport(SYSTEMD, "/sys/fs/cgroup", "systemd is PID 1")
    plan = [CgroupWeight("db", "critical", 1000, unit="db.service"), CgroupWeight("web", "standard", 500, unit="web.service")]
    crashed = CgroupWeights(support, run=run)
    assert crashed.apply(plan).applied == {CPU_WEIGHT: 2}
    assert units == {"db.service": "1000", "web.service": "500"}
    units["web.service"] = "50"  # someone else: systemctl set-property by hand
    again = crashed.apply(plan)
    assert (again.drift, again.applied) == ({CPU_WEIGHT: 1}, {})
    assert units["web.service"] == "50"
    fresh = CgroupWeights(support, run=run)
    fresh.adopt_state(crashed.state())  # a kill, then the next start
    done = fresh.restore_all()
    assert (done.restored, done.drift) == ({CPU_WEIGHT: 1}, {})  # the drift was theirs, and counted, before the kill
    assert units == {"db.service": "[not set]", "web.service": "50"}
    assert ["systemctl", "set-property", "--runtime", "db.service", "CPUWeight="] in calls


def test_systemctl_failure_is_reported_and_nothing_is_held():
    def run(argv):
        if argv[1] == "show":
            return 0, "[not set]\n", ""
        return 1, "", "Unit db.service not found.\n"

    weights = CgroupWeights(WeightSupport(SYSTEMD, "/sys/fs/cgroup", "systemd is PID 1"), run=run)
    result = weights.apply([CgroupWeight("db", "critical", 1000, unit="db.service")])
    assert (result.applied, result.failed) == ({}, {CPU_WEIGHT: 1})
    assert result.errors == ["systemd:db.service: setting CPUWeight=1000: Unit db.service not found."]
    assert not weights.written and weights.restore_all().restored == {}


# ---- on this host's own cgroups ----------------------------------------------------------------


@pytest.fixture
def scratch_cgroup():
    """A new cgroup under the host's cgroup2 root that has cpu.weight; removed afterwards."""
    support = detect()
    if support.method != CGROUPFS:
        pytest.skip(f"cpu.weight is not written through the cgroupfs here: {support.reason}")
    name = f"temperd-test-{os.getpid()}"
    path = os.path.join(support.cgroup2_mount, name)
    os.mkdir(path)
    try:
        if not os.path.exists(os.path.join(path, "cpu.weight")):
            pytest.skip(f"cpu is not enabled in {support.cgroup2_mount}/cgroup.subtree_control")
        yield support, "/" + name, os.path.join(path, "cpu.weight")
    finally:
        os.rmdir(path)


def _read(path):
    with open(path) as handle:
        return handle.read().strip()


@needs_root
def test_real_cgroup_weight_set_drift_restore_and_recovery(scratch_cgroup, tmp_path):
    support, cgroup, path = scratch_cgroup
    original = _read(path)
    plan = _plan(CgroupWeight("scratch", "critical", 777, cgroup=cgroup))

    def backend():
        return NativeBackend(str(tmp_path), weights=CgroupWeights(support), pmqos=PmQos(str(tmp_path / "no-sysfs")),
                             autogroup=False)

    crashed = backend()
    assert crashed.apply(plan, []).applied == {CPU_WEIGHT: 1}
    assert _read(path) == "777"
    assert backend().recover().restored == {CPU_WEIGHT: 1}  # the next start after a kill
    assert _read(path) == original

    weights = CgroupWeights(support)
    weights.apply(plan.cgroup_weights)
    with open(path, "w") as handle:
        handle.write("33")  # another writer
    assert weights.apply(plan.cgroup_weights).drift == {CPU_WEIGHT: 1}
    assert _read(path) == "33"
    assert weights.restore_all().restored == {}
    assert _read(path) == "33"  # theirs


@pytest.fixture
def transient_unit():
    """A transient service that sleeps, under systemd; stopped afterwards."""
    support = detect()
    if support.method != SYSTEMD:
        pytest.skip(f"weights are not asked of systemd here: {support.reason}")
    unit = f"temperd-test-{os.getpid()}.service"
    started = subprocess.run(["systemd-run", f"--unit={unit}", "--collect", "sleep", "300"],
                             capture_output=True, text=True, timeout=30)
    if started.returncode != 0:
        pytest.skip(f"systemd-run failed: {started.stderr.strip()}")
    try:
        yield support, unit
    finally:
        subprocess.run(["systemctl", "stop", unit], capture_output=True, timeout=30)


def _unit_weight(unit):
    return subprocess.run(["systemctl", "show", "--property=CPUWeight", "--value", unit],
                          capture_output=True, text=True, timeout=10).stdout.strip()


@needs_root
def test_real_systemd_weight_set_drift_restore_and_recovery(transient_unit, tmp_path):
    support, unit = transient_unit
    original = _unit_weight(unit)
    plan = _plan(CgroupWeight("scratch", "critical", 777, unit=unit))

    def backend():
        return NativeBackend(str(tmp_path), weights=CgroupWeights(support), pmqos=PmQos(str(tmp_path / "no-sysfs")),
                             autogroup=False)

    crashed = backend()
    result = crashed.apply(plan, [])
    assert result.applied == {CPU_WEIGHT: 1}, result.errors
    assert _unit_weight(unit) == "777"
    recovered = backend().recover()
    assert recovered.restored == {CPU_WEIGHT: 1}, recovered.errors
    assert _unit_weight(unit) == original

    weights = CgroupWeights(support)
    weights.apply(plan.cgroup_weights)
    subprocess.run(["systemctl", "set-property", "--runtime", unit, "CPUWeight=33"], check=True, timeout=30)
    assert weights.apply(plan.cgroup_weights).drift == {CPU_WEIGHT: 1}
    assert weights.restore_all().restored == {}
    assert _unit_weight(unit) == "33"  # theirs


def test_between_whole_applies_only_a_new_weight_is_looked_up_and_read():
    """A batch of process events in which a workload came asks systemd about that workload's
    unit alone; a whole apply reads every weight again (drift)."""
    calls = []
    state = {}

    def run(argv):
        calls.append(list(argv))
        if argv[1] == "show":
            return 0, state.get(argv[-1], "[not set]") + "\n", ""
        state[argv[3]] = argv[4].split("=", 1)[1]
        return 0, "", ""

    weights = CgroupWeights(WeightSupport(SYSTEMD, "/sys/fs/cgroup", "systemd is PID 1"), run=run)
    db = CgroupWeight("db", "critical", 1000, unit="db.service")
    web = CgroupWeight("web", "batch", 50, unit="web.service")
    assert weights.apply([db]).applied == {CPU_WEIGHT: 1}
    calls.clear()
    assert weights.apply([db, web], verify=False).applied == {CPU_WEIGHT: 1}
    assert [c[-1] for c in calls if c[1] == "show"] == ["web.service"]
    calls.clear()
    assert weights.apply([web], verify=False).restored == {CPU_WEIGHT: 1}  # db's workload left: its original back
    assert [c[-1] for c in calls if c[1] == "show"] == ["db.service"]
    calls.clear()
    state["web.service"] = "77"  # someone else's
    assert weights.apply([web]).drift == {CPU_WEIGHT: 1}
    assert [c[-1] for c in calls if c[1] == "show"] == ["web.service"]
