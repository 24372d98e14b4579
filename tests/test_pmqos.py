"""Per-CPU PM QoS resume bound: encoding, originals, restore, drift; and on this host's real CPUs."""

from __future__ import annotations

import os

import pytest

from temperd.backends.native.pmqos import PMQOS, PmQos, encode
from thread_children import wait_until


def _fake_tree(root, cpus, value="0"):
    for cpu in cpus:
        power = root / f"cpu{cpu}" / "power"
        power.mkdir(parents=True)
        (power / "pm_qos_resume_latency_us").write_text(value + "\n")
    return PmQos(str(root))


def _value(root, cpu):
    return (root / f"cpu{cpu}" / "power" / "pm_qos_resume_latency_us").read_text().strip()


def test_encoding_zero_us_is_na_because_0_means_no_constraint():
    assert encode(0) == "n/a"
    assert encode(20) == "20"
    with pytest.raises(ValueError):
        encode(-1)


def test_apply_remembers_originals_and_restores(tmp_path):
    qos = _fake_tree(tmp_path, [0, 1], "0")
    (tmp_path / "cpu1" / "power" / "pm_qos_resume_latency_us").write_text("50\n")
    result = qos.apply({0: 20, 1: 0})
    assert (result.applied, result.failed) == ({PMQOS: 2}, {})
    assert (_value(tmp_path, 0), _value(tmp_path, 1)) == ("20", "n/a")
    again = qos.apply({0: 20, 1: 0})
    assert again.applied == {}  # already holds: nothing written
    # CPU 1 leaves the plan: its original comes back at once.
    shrink = qos.apply({0: 20})
    assert shrink.restored == {PMQOS: 1} and _value(tmp_path, 1) == "50"
    done = qos.restore_all()
    assert done.restored == {PMQOS: 1} and _value(tmp_path, 0) == "0"
    assert not qos.originals and not qos.written


def test_missing_file_is_unsupported_and_says_so(tmp_path):
    qos = _fake_tree(tmp_path, [0])
    result = qos.apply({0: 10, 3: 10})
    assert result.applied == {PMQOS: 1} and not result.failed
    assert len(result.unsupported) == 1
    assert "cpu3/power/pm_qos_resume_latency_us does not exist" in result.unsupported[0]


def test_someone_elses_write_is_drift_left_alone(tmp_path):
    qos = _fake_tree(tmp_path, [0])
    qos.apply({0: 20})
    (tmp_path / "cpu0" / "power" / "pm_qos_resume_latency_us").write_text("7\n")
    result = qos.apply({0: 20})
    assert result.drift == {PMQOS: 1} and not result.applied
    assert _value(tmp_path, 0) == "7"
    assert not qos.apply({0: 20}).drift  # counted once
    qos.restore_all()
    assert _value(tmp_path, 0) == "7"  # theirs, not restored over


def test_adopted_state_from_a_previous_run_is_restored(tmp_path):
    qos = _fake_tree(tmp_path, [0], "n/a")
    fresh = PmQos(str(tmp_path))
    fresh.adopt_state({"originals": {"0": "0"}, "written": {"0": "n/a"}})
    assert fresh.restore_all().restored == {PMQOS: 1}
    assert _value(tmp_path, 0) == "0"
    assert qos.read(0) == "0"


REAL = "/sys/devices/system/cpu/cpu1/power/pm_qos_resume_latency_us"
STATES = "/sys/devices/system/cpu/cpu1/cpuidle"


@pytest.fixture
def real_cpu1():
    if not os.path.exists(REAL):
        pytest.skip(f"{REAL} does not exist on this host")
    if not os.access(REAL, os.W_OK):
        pytest.skip(f"{REAL} is not writable (needs root)")
    with open(REAL) as handle:
        original = handle.read().strip()
    yield original
    with open(REAL, "w") as handle:  # the host gets its value back even when the test fails
        handle.write(original)


def _idle_usage():
    usage = {}
    for state in sorted(os.listdir(STATES)):
        with open(f"{STATES}/{state}/name") as handle:
            name = handle.read().strip()
        with open(f"{STATES}/{state}/usage") as handle:
            usage[name] = int(handle.read())
    return usage


def test_real_cpu_bound_is_set_read_back_and_restored(real_cpu1):
    qos = PmQos()
    assert qos.supported(1) == (True, "")
    assert qos.apply({1: 25}).applied == {PMQOS: 1}
    assert qos.read(1) == "25"
    assert qos.restore_all().restored == {PMQOS: 1}
    assert qos.read(1) == real_cpu1


def test_real_zero_bound_keeps_the_cpu_out_of_sleeping_idle_states(real_cpu1):
    """Bound 0 ("n/a"): the governor may only choose polling; no sleeping state is entered."""
    if not os.path.isdir(STATES):
        pytest.skip("no cpuidle states for CPU 1")
    qos = PmQos()
    qos.apply({1: 0})
    try:
        # A state's usage counts on exit, and the bound does not wake a CPU already asleep: the
        # sleep in progress at apply() is counted when it ends. Once CPU 1 has polled, it has ended.
        applied = _idle_usage()
        wait_until(lambda: _idle_usage().get("POLL", 0) > applied.get("POLL", 0), 5)
        start = _idle_usage()
        # CPU 1 went idle 20 times since (each time polling): 20 chances to enter a sleeping state.
        went_idle = wait_until(lambda: _idle_usage().get("POLL", 0) - start.get("POLL", 0) >= 20, 5)
        during = _idle_usage()
    finally:
        qos.restore_all()
    assert went_idle, f"CPU 1 did not poll 20 times in 5 s (idle in sleeping states instead?): {start} -> {during}"
    sleeping = {name: during[name] - start[name] for name in start if name != "POLL"}
    assert sleeping and all(delta == 0 for delta in sleeping.values()), sleeping
    assert qos.read(1) == real_cpu1
