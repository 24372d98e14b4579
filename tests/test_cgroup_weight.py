"""Tier weights: which way this host allows (and why not), systemd and cgroupfs paths, restore, drift."""

from __future__ import annotations

import os

from temperd.backends.native.cgroup_weight import (CGROUPFS, SYSTEMD, CgroupWeights, WeightSupport, detect)
from temperd.plan import CgroupWeight


def test_this_host_support_is_decided_with_a_reason():
    support = detect()
    assert support.reason
    if support.method is None:
        # e.g. a hybrid host without systemd: cgroup2 mounted, but the cpu controller bound to v1
        assert "cpu controller" in support.reason or "no cgroup2" in support.reason
    elif support.method == CGROUPFS:
        assert os.path.exists(os.path.join(support.cgroup2_mount, "cgroup.controllers"))


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
    assert result.applied == 0 and "unsupported" in result.unsupported[0]


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
    assert result.applied == 2 and not result.failed
    assert (cg / "db" / "cpu.weight").read_text() == "1000"
    assert any("does not exist" in u and "subtree_control" in u for u in result.unsupported)
    (cg / "batch" / "cpu.weight").write_text("50")  # someone else
    again = weights.apply(plan)
    assert again.drift == 1 and again.applied == 0
    done = weights.restore_all()
    assert done.restored == 1
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
    assert result.applied == 1
    assert ["systemctl", "set-property", "--runtime", "postgresql.service", "CPUWeight=1000"] in calls
    assert weights.restore_all().restored == 1
    assert calls[-1] == ["systemctl", "set-property", "--runtime", "postgresql.service", "CPUWeight="]
    assert state["CPUWeight"] == "[not set]"
