"""The classifier (temperd/decide/classify.py) on given signals: every class, the reason naming
the thresholds that fired with their values, hints overriding measurement, and a confidence that
drops for missing sources and short windows."""

from temperd.config.profile import Traits
from temperd.decide.classify import (BUSIEST_THREAD, CPU_CAPACITY, CPU_DEMAND, D_STATE_SHARE, HOST_PSI_IO, HOT_THREADS,
                                     IO_BYTES, IPC, LLC_MISSES, MAJOR_FAULTS, MEMORY_USE, PSI_IO, PSI_MEMORY,
                                     SHARED_PSI_IO, Hints, WorkloadSignals, classify, traits_of)

ALL_HERE = ("schedstat", "psi", "proc_io", "task_state")
NO_PMU = {"perf": "no PMU", "rapl": "no /sys/class/powercap", "delayacct": "kernel.task_delayacct is 0",
          "nvml": "no NVIDIA GPU"}


def signals(measured, sources=ALL_HERE, missing=None, window=600.0, **kw):
    return WorkloadSignals("fixture", window, 600.0, measured=measured, sources=sources,
                           missing=NO_PMU if missing is None else missing, **kw)


def test_one_busy_thread_is_compute_high_and_cap_sensitive():
    c = classify(signals({CPU_DEMAND: 1.0, CPU_CAPACITY: 1, HOT_THREADS: 1, BUSIEST_THREAD: 1.0, PSI_IO: 0.0,
                          PSI_MEMORY: 0.0}))
    assert (c.cpu_intensity, c.cpu_bound, c.cpu_cap_sensitivity) == ("high", "compute", "high")
    assert "util 100% > 65%" in c.reason and "busiest 1.00 CPU >= 0.8" in c.reason


def test_memory_pressure_makes_memory_bound_with_its_value_in_the_reason():
    c = classify(signals({CPU_DEMAND: 0.2, CPU_CAPACITY: 1, PSI_MEMORY: 63.0, PSI_IO: 1.0}))
    assert c.cpu_bound == "memory" and c.cpu_intensity == "low"
    assert "own cgroup's memory pressure 63% >= 10% of the window" in c.reason


def test_own_io_pressure_or_d_state_sleeps_with_its_own_io_make_io_bound():
    by_psi = classify(signals({CPU_DEMAND: 0.1, CPU_CAPACITY: 1, PSI_IO: 40.0, IO_BYTES: 4e6}))
    by_state = classify(signals({CPU_DEMAND: 0.1, CPU_CAPACITY: 1, D_STATE_SHARE: 0.8, IO_BYTES: 4e6},
                                sources=("schedstat", "task_state", "proc_io")))
    assert by_psi.cpu_bound == by_state.cpu_bound == "io"
    assert "own cgroup's io pressure 40% >= 10%" in by_psi.reason
    assert "its processes' storage I/O 3.8 MiB/s" in by_psi.reason
    assert "80% of its sampled sleeps in D state" in by_state.reason
    # D-state sleeps that are not page-ins are its own waits even where its bytes go unseen
    unseen = classify(signals({CPU_DEMAND: 0.1, CPU_CAPACITY: 1, D_STATE_SHARE: 0.8, MAJOR_FAULTS: 0.0}))
    assert unseen.cpu_bound == "io" and "not page-ins (0 major faults/s)" in unseen.reason


def test_pressure_of_the_host_or_a_shared_cgroup_is_context_never_the_cause():
    """An fsync writer in another cgroup raises the host's io pressure (39 % seen): a spinner stays
    compute, a sleeper with no I/O and no faults stays low and not io, each reason naming the
    pressure with its scope."""
    spinner = classify(signals({CPU_DEMAND: 1.0, CPU_CAPACITY: 1, HOT_THREADS: 1, BUSIEST_THREAD: 1.0,
                                HOST_PSI_IO: 39.0, SHARED_PSI_IO: 39.0, IO_BYTES: 0.0, MAJOR_FAULTS: 0.0},
                               psi_scope="cgroup / (shared with other processes)"))
    assert (spinner.cpu_intensity, spinner.cpu_bound) == ("high", "compute"), spinner.reason
    assert "context, not its own and no cause of its class: io pressure 39% in cgroup / (shared with other " \
           "processes), host io pressure 39%" in spinner.reason
    sleeper = classify(signals({CPU_DEMAND: 0.004, CPU_CAPACITY: 1, HOST_PSI_IO: 39.0, SHARED_PSI_IO: 39.0,
                                IO_BYTES: 0.0, MAJOR_FAULTS: 0.0}))
    assert sleeper.cpu_intensity == "low" and sleeper.cpu_bound != "io", sleeper.reason
    assert "paging" not in sleeper.reason and "host io pressure 39%" in sleeper.reason
    # its own cgroup's io pressure without I/O of its own to wait on is not io-bound either
    no_own_io = classify(signals({CPU_DEMAND: 0.004, CPU_CAPACITY: 1, PSI_IO: 30.0, IO_BYTES: 0.0}))
    assert no_own_io.cpu_bound != "io", no_own_io.reason


def test_swapping_is_memory_bound_though_it_raises_io_pressure_too():
    """A memory hog held below its working set swaps: io pressure rises with memory pressure, and a
    swap file's reads may count as its own storage I/O (seen: 1 483 faults/s, memory 18 %, io 14 %)."""
    swapping = classify(signals({CPU_DEMAND: 0.14, CPU_CAPACITY: 1, PSI_MEMORY: 18.0, PSI_IO: 14.0,
                                 MAJOR_FAULTS: 1483.0, IO_BYTES: 5e6}))
    assert swapping.cpu_bound == "memory"
    assert "its own io pressure 14% no larger than its memory pressure 18%, with 1483 major faults/s (paging)" \
        in swapping.reason
    faulting_in = classify(signals({CPU_DEMAND: 0.26, CPU_CAPACITY: 1, PSI_MEMORY: 23.0, PSI_IO: 14.0,
                                    MAJOR_FAULTS: 1986.0, IO_BYTES: 121e6, D_STATE_SHARE: 1.0}))
    assert faulting_in.cpu_bound == "memory", faulting_in.reason  # its D-state sleeps wait on swap-ins
    assert "100% of its sampled sleeps in D state >= 50% (paging)" in faulting_in.reason
    # Seen in CI under a cgroup v1 limit: the swap-ins raised no io pressure at all, only D-state sleeps.
    quiet_io = classify(signals({CPU_DEMAND: 0.21, CPU_CAPACITY: 1, PSI_MEMORY: 13.0, PSI_IO: 4.0,
                                 MAJOR_FAULTS: 1290.0, IO_BYTES: 77e6, D_STATE_SHARE: 1.0}))
    assert quiet_io.cpu_bound == "memory", quiet_io.reason
    # The fixture run beside an io writer: at 100 % of its limit, its page-ins (131 MiB/s, 2 644
    # faults/s) raised io pressure above its memory pressure; they are still its paging.
    at_limit = classify(signals({CPU_DEMAND: 0.2, CPU_CAPACITY: 1, PSI_MEMORY: 12.0, PSI_IO: 29.0,
                                 MAJOR_FAULTS: 2644.0, IO_BYTES: 131 * 2**20, MEMORY_USE: 1.0, D_STATE_SHARE: 0.9}))
    assert at_limit.cpu_bound == "memory", at_limit.reason
    assert "at 100% of its memory limit with 2644 major faults/s (paging)" in at_limit.reason
    no_faults = classify(signals({CPU_DEMAND: 0.1, CPU_CAPACITY: 1, PSI_MEMORY: 0.0, PSI_IO: 30.0, MAJOR_FAULTS: 2.0,
                                  IO_BYTES: 5e6}))
    assert no_faults.cpu_bound == "io"
    writer_sleeping = classify(signals({CPU_DEMAND: 0.1, CPU_CAPACITY: 1, PSI_MEMORY: 0.0, PSI_IO: 30.0,
                                        MAJOR_FAULTS: 0.0, IO_BYTES: 5e6, D_STATE_SHARE: 0.9}))
    assert writer_sleeping.cpu_bound == "io" and "(paging)" not in writer_sleeping.reason
    # Seen in CI: 518 faults/s at its limit with 3.5 % memory pressure and no io signs of its own;
    # the faults alone made it memory-bound, and the reason says they are paging.
    faulting_only = classify(signals({CPU_DEMAND: 0.09, CPU_CAPACITY: 1, PSI_MEMORY: 3.5, PSI_IO: 0.0,
                                      MAJOR_FAULTS: 518.0, IO_BYTES: 0.0, MEMORY_USE: 1.0}))
    assert faulting_only.cpu_bound == "memory", faulting_only.reason
    assert "paging: its major faults 518/s >= 100/s" in faulting_only.reason


def test_a_hot_thread_beside_io_stalls_is_mixed_naming_both():
    c = classify(signals({CPU_DEMAND: 1.2, CPU_CAPACITY: 2, HOT_THREADS: 1, BUSIEST_THREAD: 0.98, PSI_IO: 35.0,
                          IO_BYTES: 2e6}))
    assert c.cpu_bound == "mixed" and c.cpu_intensity == "medium"
    assert "compute: " in c.reason and "io: " in c.reason


def test_a_sleeping_service_is_low_and_mixed_because_nothing_dominates():
    c = classify(signals({CPU_DEMAND: 0.004, CPU_CAPACITY: 1, PSI_IO: 0.0, PSI_MEMORY: 0.0}))
    assert (c.cpu_intensity, c.cpu_bound, c.cpu_cap_sensitivity) == ("low", "mixed", "low")
    assert "no resource dominates" in c.reason


def test_low_ipc_with_cache_misses_is_memory_bound_compute_where_a_pmu_exists():
    c = classify(signals({CPU_DEMAND: 1.0, CPU_CAPACITY: 1, IPC: 0.4, LLC_MISSES: 25.0},
                         sources=ALL_HERE + ("perf",), missing={}))
    assert c.cpu_bound == "mixed" and "IPC 0.40 < 0.7 with 25 LLC misses/kinstr" in c.reason


def test_hints_override_and_are_marked_with_the_measured_value_beside():
    hints = Hints("profile redis [traits]", Traits(cpu_bound="memory", criticality="performance"))
    c = classify(signals({CPU_DEMAND: 1.0, CPU_CAPACITY: 1, HOT_THREADS: 1, BUSIEST_THREAD: 1.0}, hints=hints))
    assert c.cpu_bound == "memory" and c.criticality == "performance"
    assert "cpu-bound=memory (hint: profile redis [traits]; measured compute" in c.reason


def test_hints_only_give_confidence_0_3_and_say_so():
    c = classify(WorkloadSignals("w", 0, 600, hints=Hints("binding[0]", Traits(cpu_intensity="high"))))
    assert c.confidence == 0.3 and "hints only (no metrics available)" in c.reason


def test_confidence_is_lower_for_missing_sources_and_a_short_window():
    measured = {CPU_DEMAND: 0.5, CPU_CAPACITY: 1}
    full = classify(signals(measured, sources=ALL_HERE + ("perf", "rapl", "delayacct", "nvml"), missing={}))
    here = classify(signals(measured))
    short = classify(signals(measured, window=60.0))
    assert full.confidence == 1.0 > here.confidence > short.confidence
    assert "without delayacct (kernel.task_delayacct is 0), nvml (no NVIDIA GPU), perf (no PMU)" in here.reason


def test_critical_tier_is_performance_and_the_traits_round_trip():
    c = classify(signals({CPU_DEMAND: 0.5, CPU_CAPACITY: 1}, tier="critical"))
    assert c.criticality == "performance"
    assert Traits(**traits_of(c)).cpu_bound == c.cpu_bound
    assert c.as_json()["cpu"]["avgUtilizationPct"] == 50.0
