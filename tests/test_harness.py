"""temperd.training.harness: the measurement core of the benchmarks and of profile evaluation, on
real spinners, real cgroups and this host's /proc."""

import os
import subprocess
import sys
import time

import pytest

from temperd.training import harness as T

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="cgroup directories and SCHED_IDLE checks need root")

# No quotes inside: it also goes through a shell's single quotes.
SPIN = "import sys, time\nend = time.monotonic() + float(sys.argv[1])\nwhile time.monotonic() < end: pass\n"


def _wait_gone(pid: int, timeout_s: float = 5.0) -> bool:
    def gone() -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        state = (T.procfs.read_thread_stat(pid) or T.procfs.TaskStat("", "X", 0, 0, 0, 0, 0, 0)).state
        return state in ("Z", "X")
    return bool(T.wait_until(gone, timeout_s))


# ---- spinners and cgroups ---------------------------------------------------------------------------------


@needs_root
def test_spinners_run_in_their_cgroup_and_are_gone_after():
    with T.ScratchCgroup(T.scratch_name("test-spin")) as cgroup:
        with T.spinners(2, 30, cgroup) as workers:
            assert len(workers) == 2
            members = set(cgroup.pids())
            assert set(workers) <= members, (workers, members)
            for pid in workers:
                assert f"0::{cgroup.relative}" in open(f"/proc/{pid}/cgroup").read()
            before = {pid: T.read_proc_cpu(pid).cpu_ticks for pid in workers}
            assert T.wait_until(lambda: all(T.read_proc_cpu(pid).cpu_ticks > before[pid] for pid in workers), 5.0), \
                "spinners do not spin"
        assert all(_wait_gone(pid) for pid in workers)
        assert T.wait_until(lambda: cgroup.pids() == [], 5.0) is not False
    assert not os.path.exists(cgroup.path), "the scratch cgroup was not removed"


@needs_root
def test_spinners_stop_by_themselves_at_their_limit():
    with T.ScratchCgroup(T.scratch_name("test-limit")) as cgroup:
        with T.spinners(1, 1, cgroup) as workers:
            assert _wait_gone(workers[0], 6.0), "a spinner outlived its time limit"


@needs_root
def test_spinners_start_under_a_wrapper():
    """The operator's `nice -n 19 chrt --idle 0` prefix reaches every spinner."""
    with T.spinners(1, 30, None, ("nice", "-n", "19", "chrt", "--idle", "0")) as workers:
        assert os.sched_getscheduler(workers[0]) == os.SCHED_IDLE
        assert os.getpriority(os.PRIO_PROCESS, workers[0]) == 19


def test_spinners_share_the_callers_session_unless_asked_for_their_own():
    """The isolation bench's batch job sits in the benchmark's session (one autogroup); train
    evaluate's gets its own, as a service manager starts one, so temperd can weigh its autogroup."""
    with T.spinners(1, 30) as beside, T.spinners(1, 30, own_session=True) as apart:
        assert os.getsid(beside[0]) == os.getsid(0)
        assert os.getsid(apart[0]) != os.getsid(0) and os.getsid(apart[0]) == os.getpgid(apart[0])
    assert _wait_gone(apart[0]) and _wait_gone(beside[0])


def test_python_spinners_when_stress_ng_is_missing(monkeypatch):
    monkeypatch.setattr(T.shutil, "which", lambda name: None)
    argv = T.spinner_argv(2, 1.2)
    assert argv[0] == sys.executable and argv[-2:] == ["2", "1"]
    started = time.monotonic()
    done = subprocess.run(argv, timeout=20)
    assert done.returncode == 0 and 0.9 <= time.monotonic() - started < 10


def test_no_spinners_start_nothing():
    with T.spinners(0, 10) as workers:
        assert workers == []


# ---- host noise and runqueue wait ---------------------------------------------------------------------------


def test_foreign_cpu_is_what_processes_outside_ours_used():
    """A process reparented away from us (its shell exited) is foreign, with exactly the ticks it
    used; our own child never counts, nor a process named as ours."""
    ours = subprocess.Popen([sys.executable, "-c", SPIN, "3"])
    orphan_parent = subprocess.run(["sh", "-c", f"{sys.executable} -c '{SPIN}' 3 >/dev/null 2>&1 & echo $!"],
                                   capture_output=True, text=True, timeout=10)
    orphan = int(orphan_parent.stdout.strip())
    try:
        assert T.wait_until(lambda: (T.read_proc_cpu(orphan) or T.ProcCpu(0, "", 0, False, 0)).comm.startswith("python"), 5)
        before = T.all_proc_cpu()
        assert T.wait_until(lambda: T.read_proc_cpu(orphan).cpu_ticks - before[orphan].cpu_ticks >= 10, 5)
        after = T.all_proc_cpu()
    finally:
        ours.kill()
        ours.wait()
        _wait_gone(orphan)
    assert after[orphan].ppid != os.getpid()
    foreign = T.foreign_ticks(before, after, [os.getpid()])
    assert foreign.get(orphan) == after[orphan].cpu_ticks - before[orphan].cpu_ticks > 0
    assert ours.pid not in foreign and os.getpid() not in foreign
    assert orphan not in T.foreign_ticks(before, after, [os.getpid(), orphan])
    assert all(not after[pid].kernel_thread for pid in foreign)


def test_host_monitor_window():
    """Over a window with a spinner of another session, the monitor sees the CPUs busy and says
    when the foreign share passes the limit."""
    spinner = subprocess.run(["sh", "-c", f"{sys.executable} -c '{SPIN}' 2 >/dev/null 2>&1 & echo $!"],
                             capture_output=True, text=True, timeout=10)
    orphan = int(spinner.stdout.strip())
    try:
        monitor = T.HostMonitor()
        monitor.start()
        ticks0 = T.read_proc_cpu(orphan).cpu_ticks
        # The window ends once the spinner used half a second of CPU (it spins for 2 s of wall time).
        assert T.wait_until(lambda: T.read_proc_cpu(orphan).cpu_ticks - ticks0 >= T.TICK_HZ // 2, 1.8), \
            "the spinner did not spin"
        ticks1 = T.read_proc_cpu(orphan).cpu_ticks
        window = monitor.stop()
    finally:
        _wait_gone(orphan)
    spinner_s = (ticks1 - ticks0) / T.TICK_HZ
    spinner_pct = 100.0 * spinner_s / window.seconds
    assert spinner_s - 2 / T.TICK_HZ <= window.seconds < 3  # the window holds what the spinner ran in it
    assert 0 <= window.idle_pct < 100 and 0 <= window.steal_pct <= 100
    assert window.foreign_core_pct >= spinner_pct - 2 * 100.0 / T.TICK_HZ > 0, window
    assert window.noisy(T.NoiseLimits(foreign_core_pct=window.foreign_core_pct - 1))
    assert not window.noisy(T.NoiseLimits(foreign_core_pct=1000, steal_pct=100))
    assert "foreign" in window.describe()
    if T.procfs.read_resched_interrupts() is not None:  # every Linux SMP kernel has the row
        assert window.resched_per_s is not None and window.resched_per_s >= 0
        assert "resched IPIs" in window.describe()


X86_INTERRUPTS = """            CPU0       CPU1
   0:         44          0   IO-APIC   2-edge      timer
 NMI:          0          0   Non-maskable interrupts
 LOC:   22808922   23341339   Local timer interrupts
 RES:   18879520   18047152   Rescheduling interrupts
 CAL:   36758387   33586642   Function call interrupts
 ERR:          0
"""

ARM64_INTERRUPTS = """           CPU0       CPU1       CPU2
 11:     101205      99812     100311     GICv3  27 Level     arch_timer
IPI0:       812        903        777       Rescheduling interrupts
IPI1:        10         12         11       Function call interrupts
Err:          0
"""


@pytest.mark.parametrize("text, expected", [(X86_INTERRUPTS, 18879520 + 18047152),
                                            (ARM64_INTERRUPTS, 812 + 903 + 777),
                                            (" LOC:   5   6   Local timer interrupts\n", None)])
def test_resched_interrupts_are_summed_over_the_cpus_by_the_rows_text(tmp_path, monkeypatch, text, expected):
    (tmp_path / "interrupts").write_text(text)
    monkeypatch.setattr(T.procfs, "PROC", str(tmp_path))
    assert T.procfs.read_resched_interrupts() == expected


def test_a_window_without_resched_counts_says_nothing_of_them():
    window = T.HostWindow(1.0, 50.0, 0.0, 0.0, "")
    assert window.resched_per_s is None and "IPI" not in window.describe()


def test_wait_meter_adds_up_schedstat_and_sees_a_crowded_cpu():
    """The meter's numbers are the threads' own schedstat deltas; and a process sharing its CPU
    with four spinners of its session waits a larger share of the time it wants than one alone
    there (on a shared host others add wait to both: two rounds each, summed)."""
    cpu = min(os.sched_getaffinity(0))

    def pinned(seconds: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-c", SPIN, seconds],
                                preexec_fn=lambda: os.sched_setaffinity(0, {cpu}))

    def measure(crowd: int):
        others = [pinned("3") for _ in range(crowd)]
        target = pinned("3")
        try:
            time.sleep(0.2)
            meter = T.WaitMeter()
            before = T.thread_schedstats(target.pid)[target.pid]
            meter.start(target=[target.pid])
            for _ in range(10):
                time.sleep(0.1)
                meter.sample()
            found = meter.stop()["target"]
            after = T.thread_schedstats(target.pid)[target.pid]
            return found, (after[0] - before[0]) / 1e9, (after[1] - before[1]) / 1e9
        finally:
            for proc in [target, *others]:
                proc.kill()
                proc.wait()

    crowded, run_s, wait_s = measure(4)
    assert 0.9 <= crowded.seconds < 3
    assert crowded.run_s == pytest.approx(run_s, abs=0.05) and crowded.wait_s == pytest.approx(wait_s, abs=0.05)
    assert crowded.wait_pct == pytest.approx(100 * crowded.wait_s / crowded.seconds)
    alone = [measure(0)[0], measure(0)[0]]
    crowded_again = measure(4)[0]
    assert crowded.delay_pct > 40, crowded
    assert sum(a.delay_pct for a in alone) < crowded.delay_pct + crowded_again.delay_pct, (alone, crowded, crowded_again)


def test_wait_meter_keeps_a_process_that_exited():
    meter = T.WaitMeter()
    meter.start()
    # The child spins 0.3 s, says so, and exits only when told: the meter's last reading while it lives
    # is taken after the spin, however late this process gets the CPU on a crowded host.
    child = SPIN + "print('spun', flush=True)\nsys.stdin.read()\n"
    proc = subprocess.Popen([sys.executable, "-c", child, "0.3"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    meter.follow("client", proc.pid)
    meter.sample()
    assert proc.stdout.readline() == "spun\n"
    meter.sample()
    proc.stdin.close()
    proc.wait(timeout=10)
    proc.stdout.close()
    meter.sample()
    found = meter.stop()["client"]
    # It spun for 0.3 s of wall time: running or waiting for a CPU all along, read before it exited.
    assert found.run_s > 0.01 and found.run_s + found.wait_s > 0.2, found


# ---- order, retries, statistics ----------------------------------------------------------------------------


def test_arm_order_alternates_per_repetition():
    assert T.arm_order(["a", "b", "c"], 0) == ("a", "b", "c")
    assert T.arm_order(["a", "b", "c"], 1) == ("c", "b", "a")
    assert T.arm_order(["a", "b", "c"], 2) == ("a", "b", "c")


def _window(foreign: float) -> T.HostWindow:
    return T.HostWindow(1.0, 50.0, 0.0, foreign, "")


def test_run_trials_interleaves_arms_and_repeats_noisy_runs():
    calls = []
    noisy_once = {("bg=1", "temperd", 0)}

    def measure(step, arm, rep):
        calls.append((step, arm, rep))
        noisy = (step, arm, rep) in noisy_once
        noisy_once.discard((step, arm, rep))
        return T.Run(step, arm, rep, metrics={"p99_ms": 1.0}, window=_window(50.0 if noisy else 1.0))

    plan = T.TrialPlan(["bg=0", "bg=1"], lambda step: ["stock", "temperd"], reps=2, max_retries=3)
    runs = T.run_trials(plan, measure)
    assert [(r.step, r.arm, r.rep) for r in runs] == [
        ("bg=0", "stock", 0), ("bg=0", "temperd", 0), ("bg=1", "stock", 0), ("bg=1", "temperd", 0),
        ("bg=0", "temperd", 1), ("bg=0", "stock", 1), ("bg=1", "temperd", 1), ("bg=1", "stock", 1)]
    assert calls.count(("bg=1", "temperd", 0)) == 2
    repeated = runs[3]
    assert repeated.retried and not repeated.noisy


def test_run_trials_keeps_a_noisy_run_once_the_retry_budget_is_spent():
    def measure(step, arm, rep):
        return T.Run(step, arm, rep, window=_window(80.0))

    runs = T.run_trials(T.TrialPlan(["s"], lambda step: ["a"], reps=3, max_retries=1), measure)
    assert [r.noisy for r in runs] == [True, True, True]
    assert [r.retried for r in runs] == [True, False, False]


def test_run_trials_stops_at_its_deadline():
    plan = T.TrialPlan(["s"], lambda step: ["a"], reps=5, deadline=time.monotonic() - 1)
    with pytest.raises(T.OutOfTime):
        T.run_trials(plan, lambda step, arm, rep: T.Run(step, arm, rep))


def test_spread_and_median_leave_missing_values_out():
    s = T.spread([3.0, float("nan"), 1.0, 2.0])
    assert (s.median, s.low, s.high, s.n) == (2.0, 1.0, 3.0, 3)
    assert T.spread([]).n == 0


def test_compare_calls_overlapping_runs_within_noise():
    baseline = T.spread([10.0, 11.0, 12.0])
    assert T.compare(T.spread([11.5, 12.5, 13.0]), baseline, higher_is_better=True).verdict == T.WITHIN_NOISE
    faster = T.compare(T.spread([14.0, 15.0, 16.0]), baseline, higher_is_better=True)
    assert faster.verdict == T.BETTER and faster.ratio == pytest.approx(15 / 11)
    # Latency: lower is better.
    assert T.compare(T.spread([14.0, 15.0, 16.0]), baseline, higher_is_better=False).verdict == T.WORSE
    # Apart but by less than the minimum effect.
    tight = T.spread([100.0, 100.1])
    assert T.compare(T.spread([101.0, 101.1]), tight, higher_is_better=True).verdict == T.WITHIN_NOISE
    # One run a side has no range to judge by.
    single = T.compare(T.spread([30.0]), T.spread([10.0]), higher_is_better=True)
    assert single.verdict == T.WITHIN_NOISE and single.ratio == 3.0


def test_summarise_groups_good_runs_by_step_and_arm():
    runs = [T.Run("s", "a", 0, metrics={"p99_ms": 1.0}), T.Run("s", "a", 1, metrics={"p99_ms": 3.0}),
            T.Run("s", "a", 2, error="failed"), T.Run("s", "b", 0, metrics={"p99_ms": 2.0})]
    found = T.summarise(runs, "p99_ms")
    assert found[("s", "a")] == T.Spread(2.0, 1.0, 3.0, 2)
    assert found[("s", "b")].median == 2.0
