"""Backend selection: auto picks scx_layered only where sched_ext and the binary are there, and says why."""

import os

import pytest

from temperd.backends.scx.detect import detect_sched_ext
from temperd.backends.select import choose, make_backend, scx_availability
from temperd.config.daemon_config import DaemonConfig


def fake_sysfs(tmp_path, state, ops=None):
    base = tmp_path / "kernel" / "sched_ext"
    (base / "root").mkdir(parents=True)
    (base / "state").write_text(state + "\n")
    if ops is not None:
        (base / "root" / "ops").write_text(ops + "\n")
    return str(tmp_path)


def test_this_host_has_no_sched_ext_so_auto_means_native():
    if os.path.isdir("/sys/kernel/sched_ext"):
        pytest.skip("this kernel has sched_ext")
    found = scx_availability("/sys")
    assert not found.usable and "no /sys/kernel/sched_ext" in found.reason
    choice = choose("auto", found.usable, found.reason)
    assert choice.active == "native"
    assert choice.reason.startswith("auto: no /sys/kernel/sched_ext") and choice.reason.endswith("native backend")


def test_scx_requested_but_unavailable_falls_back_and_says_so():
    choice = choose("scx", False, "no sched_ext")
    assert choice.active == "native" and "requested but unavailable (no sched_ext)" in choice.reason


def test_native_requested():
    assert choose("native", True, "").active == "native"


def test_another_scheduler_loaded_is_named(tmp_path):
    found = detect_sched_ext(fake_sysfs(tmp_path, "enabled", "rustland_1.0.3"), binary="/usr/bin/scx_layered")
    assert not found.usable and found.kernel_supported
    assert "'rustland_1.0.3' is loaded" in found.reason


def test_disabled_state_with_binary_is_usable(tmp_path):
    found = detect_sched_ext(fake_sysfs(tmp_path, "disabled"), binary="/usr/bin/scx_layered")
    assert found.usable and choose("auto", found.usable, found.reason).active == "scx"


def test_disabled_state_without_binary(tmp_path):
    from temperd.backends.scx.detect import find_binary

    if find_binary():
        pytest.skip("scx_layered is installed here")
    found = detect_sched_ext(fake_sysfs(tmp_path, "disabled"))
    assert not found.usable and "scx_layered is not installed" in found.reason


def test_missing_capabilities_make_scx_unusable_and_name_them(tmp_path):
    sysfs = fake_sysfs(tmp_path / "sys", "disabled")
    status = tmp_path / "status"
    status.write_text("Name:\ttemperd\nCapInh:\t0000000000000000\nCapPrm:\t0000000000a00000\n"
                      "CapEff:\t0000000000a00000\n")  # CAP_SYS_NICE (23) and CAP_SYS_ADMIN (21) only
    found = detect_sched_ext(sysfs, binary="/usr/bin/scx_layered", status_path=str(status))
    assert not found.usable and found.privilege_problem
    assert found.reason.startswith("temperd lacks CAP_PERFMON, CAP_BPF, which scx_layered needs")
    status.write_text("CapEff:\t000001ffffffffff\n")  # root's full set
    assert detect_sched_ext(sysfs, binary="/usr/bin/scx_layered", status_path=str(status)).usable


def test_the_native_backend_compares_within_the_online_cpus_the_daemon_gives(tmp_path):
    """The daemon hands its machine shape's online CPUs to the backend: no second reading."""
    config = DaemonConfig(backend="native", state_dir=str(tmp_path))
    _, backend = make_backend(config, str(tmp_path), None, online_cpus=lambda: frozenset({0, 3}))
    assert backend.ledger.online_cpus() == frozenset({0, 3})
    assert backend.ledger.copy().online_cpus() == frozenset({0, 3})
