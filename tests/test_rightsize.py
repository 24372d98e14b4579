"""Rightsizing as a pure function (temperd/decide/rightsize.py) over the decaying per-thread
history (temperd/observe/usage_history.py, histogram.py): hot threads get cores of their own, the
remainder is shared, the per-container figure stays beside it; the history decays, stays bounded
and survives a save and load."""

import json
import subprocess
import sys
import time

import pytest

import cgroup_fixtures as F
from thread_children import read_json_line, wait_for

from temperd.config.daemon_config import LearnerSettings
from temperd.decide.matcher import Workload
from temperd.decide.rightsize import Declared, history_confidence, rightsize
from temperd.observe.histogram import DecayingHistogram
from temperd.observe import usage_tracker, learner
from temperd.observe.usage_history import ThreadSample, UsageHistory
from temperd.observe.learner import WorkloadLearner
from temperd.sources import procfs

DAY = 86400.0


def one_hot_seven_light(history: UsageHistory, seconds: int = 600, start: float = 1_000.0) -> None:
    w = history.of("app.service")
    for i in range(seconds):
        threads = [ThreadSample(100, 1, "hot", "workers", 1.0)]
        threads += [ThreadSample(101 + k, 1, f"light{k}", "workers", 0.1) for k in range(7)]
        w.record(start + i, threads, 0.0, history.keep_threads)


def test_one_hot_thread_and_seven_light_need_one_core_and_a_small_remainder(tmp_path):
    history = UsageHistory(str(tmp_path / "h.json"), DAY, 16)
    one_hot_seven_light(history)
    r = rightsize(history.workloads["app.service"].summary(), Declared(None, "nothing", 8), 0.15)
    assert r.exclusive_cores == 1 and [t["comm"] for t in r.hot_threads] == ["hot"]
    assert 0.7 < r.shared_cpus < 0.9  # seven at 0.1, p95 x 1.15
    assert 1.9 < r.per_container_cpus < 2.1  # the VPA-style figure: ~1.96 shared, no core for the hot thread
    assert "hot thread without a core of its own" in r.reason


def test_eight_threads_at_15_percent_need_no_exclusive_core(tmp_path):
    history = UsageHistory(str(tmp_path / "h.json"), DAY, 16)
    w = history.of("even")
    for i in range(300):
        w.record(float(i), [ThreadSample(k, 1, f"even{k}", None, 0.15) for k in range(8)], 0.0, 16)
    r = rightsize(w.summary(), Declared(2.0, "cpu.max", 8), 0.15)
    assert r.exclusive_cores == 0 and 1.3 < r.shared_cpus < 1.5 and r.savings_cpus > 0 and r.risk is None


def test_a_thread_busy_2_s_in_10_is_hot_at_p95_but_not_at_p50(tmp_path):
    history = UsageHistory(str(tmp_path / "h.json"), DAY, 16)
    w = history.of("bursty")
    for i in range(300):
        w.record(float(i), [ThreadSample(1, 1, "burst", None, 1.0 if i % 10 < 2 else 0.0)], 0.0, 16)
    r = rightsize(w.summary(), Declared(None, "nothing", 8), 0.15)
    assert r.exclusive_cores == 1 and r.hot_threads[0]["p50_cpus"] < 0.05


def test_a_quota_below_the_hot_threads_need_is_a_risk_naming_nr_throttled(tmp_path):
    history = UsageHistory(str(tmp_path / "h.json"), DAY, 16)
    w = history.of("capped")
    for i in range(120):
        w.record(float(i), [ThreadSample(1, 1, "capped", None, 1.0)], 0.0, 16)
    r = rightsize(w.summary(), Declared(0.5, "cpu.max 50000 100000", 8, throttled=(1200, 1190, 60.2)), 0.15)
    assert r.savings_cpus < 0 and "throttled in 1190 of 1200 periods (nr_throttled)" in r.risk


def test_old_samples_weigh_less_after_half_lives():
    hist = DecayingHistogram(half_life_s=60.0)
    for i in range(100):
        hist.add(1.0, float(i))  # busy long ago
    for i in range(100):
        hist.add(0.0, 600.0 + i)  # idle ten half-lives later
    assert hist.percentile(0.95) <= 0.011


def test_history_keeps_the_busiest_threads_and_survives_save_and_load(tmp_path):
    path = tmp_path / "state" / "history.json"
    history = UsageHistory(str(path), DAY, keep_threads=4)
    one_hot_seven_light(history, seconds=60)
    assert len(history.workloads["app.service"].threads) == 4
    size = history.save()
    assert size == path.stat().st_size and size < 20_000
    loaded = UsageHistory(str(path), DAY, keep_threads=4)
    assert "1 workload(s)" in loaded.load()
    before, after = history.workloads["app.service"].summary(), loaded.workloads["app.service"].summary()
    assert after == before


def test_a_damaged_history_is_set_aside_not_trusted(tmp_path):
    path = tmp_path / "history.json"
    path.write_text(json.dumps({"version": 99}))
    history = UsageHistory(str(path), DAY, 16)
    assert "unreadable" in history.load() and history.workloads == {}
    assert (tmp_path / "history.json.bad").exists()


def test_confidence_grows_with_history_length():
    assert history_confidence(0) == 0.0 < history_confidence(60) < history_confidence(3600) < history_confidence(DAY) == 1.0


def test_a_restarted_workloads_thread_inherits_its_namesakes_history(tmp_path):
    path = tmp_path / "history.json"
    history = UsageHistory(str(path), DAY, 16)
    one_hot_seven_light(history, seconds=60)
    history.save()
    loaded = UsageHistory(str(path), DAY, 16)
    loaded.load()
    w = loaded.workloads["app.service"]
    w.record(2_000.0, [ThreadSample(900, 7, "hot", "workers", 1.0)], 0.0, 16)  # new ids, same thread
    hot = [e for e in w.threads.values() if e.comm == "hot"]
    assert [e.tid for e in hot] == [900] and hot[0].hist.total > 60


def test_the_usage_thread_samples_each_interval_only_while_a_workload_is_tracked(tmp_path):
    import dataclasses

    settings = dataclasses.replace(LearnerSettings(), history_file=str(tmp_path / "history.json"))
    watch = WorkloadLearner(settings, 2, lambda: ((), None, {}))
    watch.sample_once(0.0)
    assert watch._next_wait_s() == max(settings.sample_interval_s, learner.NOTHING_TRACKED_WAIT_S)
    watch._workloads = {"redis.service": object()}  # what sample_once keeps of current()'s workloads
    assert watch._next_wait_s() == settings.sample_interval_s


def test_a_workload_is_tracked_once_its_oldest_process_has_run_a_while():
    """A fork storm's processes of a few seconds are not sampled: their use says nothing yet."""
    from types import SimpleNamespace as NS

    ticks = procfs.CLOCK_TICKS
    now = 100_000
    young = NS(key="young", pids=(10,))
    old = NS(key="old", pids=(20,))
    mixed = NS(key="mixed", pids=(30, 31))  # a unit whose old process forks young ones
    unknown = NS(key="unknown", pids=(40,))  # gone from the inventory since the match
    processes = {10: NS(start_time=now - ticks), 20: NS(start_time=now - int(learner.TRACK_AFTER_S * ticks)),
                 30: NS(start_time=now - 60 * ticks), 31: NS(start_time=now)}
    kept = learner.settled((young, old, mixed, unknown), processes, now)
    assert [w.key for w in kept] == ["old", "mixed"]


# Says so once its start-up is behind it, then sleeps.
SLEEPER = "import time; print('{}', flush=True); time.sleep(120)"


def _asleep_for_good(pid: int) -> None:
    """Wait until the process sleeps with its CPU time unchanged over two looks 0.2 s apart (on a
    busy host it may still be on its way from the print into time.sleep when the line arrives)."""
    def runtime_if_asleep():
        stat = procfs.read_process_stat(pid)
        schedstat = procfs.read_schedstat(pid, pid) if stat is not None and stat.state == "S" else None
        return schedstat.run_ns if schedstat is not None else None
    seen = [runtime_if_asleep()]

    def settled():
        seen.append(runtime_if_asleep())
        return seen[-1] is not None and seen[-1] == seen[-2]
    wait_for(lambda: time.sleep(0.2) or settled(), 10, f"pid {pid} asleep with its CPU time unchanged")


def _workload_in(cgroup, pids):
    return Workload(key="resting.service", profile_id=None, tier="standard", budget=None, budget_reason="",
                    source="binding", reason="test", unit="resting.service", cgroup=cgroup.path, pids=tuple(pids), threads=())


def test_a_workload_idle_for_30_s_is_looked_at_every_5_s_and_each_look_counts_the_seconds_it_covers(tmp_path):
    """A real sleeping process in a cgroup of its own: after RESTING_AFTER_S of unchanged cgroup CPU
    time the learner's thread waits idle_sample_interval_s, each look weighs the intervals it covers,
    and the first look that finds CPU used brings the 1 s samples back."""
    settings = LearnerSettings(history_file=str(tmp_path / "history.json"))
    with F.cgroup_parent("temperd-test-resting") as make:
        cgroup = make("app")
        sleeper = cgroup.spawn([sys.executable, "-c", SLEEPER], stdout=subprocess.PIPE)
        read_json_line(sleeper, 10)
        _asleep_for_good(sleeper.pid)  # its start-up CPU is behind it: the cgroup's CPU time stays
        workload = _workload_in(cgroup, [sleeper.pid])
        watch = WorkloadLearner(settings, 2, lambda: ((workload,), None, {}))
        history = watch.history.of("resting.service")
        now = 1_000.0
        watch.sample_once(now)
        for _ in range(int(usage_tracker.RESTING_AFTER_S) - 1):
            now += 1.0
            watch.sample_once(now)
            assert watch._next_wait_s() == settings.sample_interval_s
        now += 1.0
        watch.sample_once(now)
        assert watch._next_wait_s() == settings.idle_sample_interval_s
        history.summary()  # adds the idle looks
        before = history.samples
        now += settings.idle_sample_interval_s
        watch.sample_once(now)
        history.summary()
        assert history.samples - before == round(settings.idle_sample_interval_s / settings.sample_interval_s)

        burner = cgroup.spawn([sys.executable, "-c", "import time\nend = time.monotonic() + 0.3\n"
                               "while time.monotonic() < end: pass"])
        burner.wait(timeout=30)
        now += settings.idle_sample_interval_s
        watch.sample_once(now)
        assert watch._next_wait_s() == settings.sample_interval_s, "CPU used: back to samples every second"
        history.summary()
        assert history.samples - before == 2 * round(settings.idle_sample_interval_s / settings.sample_interval_s)


def test_a_workload_that_runs_every_few_seconds_never_rests(tmp_path):
    """A thread busy now and then (the bursty duty cycle rightsizing must see at p95) keeps the
    learner's thread sampling every second: its cgroup's CPU time moves more often than RESTING_AFTER_S."""
    settings = LearnerSettings(history_file=str(tmp_path / "history.json"))
    with F.cgroup_parent("temperd-test-bursty") as make:
        cgroup = make("app")
        sleeper = cgroup.spawn([sys.executable, "-c", SLEEPER], stdout=subprocess.PIPE)
        read_json_line(sleeper, 10)
        watch = WorkloadLearner(settings, 2, lambda: ((_workload_in(cgroup, [sleeper.pid]),), None, {}))
        now = 1_000.0
        for second in range(int(usage_tracker.RESTING_AFTER_S) * 2):
            if second % 10 == 9:  # a short burst every 10 s
                cgroup.spawn([sys.executable, "-c", "sum(range(100000))"]).wait(timeout=30)
            watch.sample_once(now)
            assert watch._next_wait_s() == settings.sample_interval_s, f"rested at second {second}"
            now += 1.0


def test_a_look_covering_several_intervals_weighs_as_many_samples():
    history = UsageHistory("/nonexistent/h.json", DAY, 16)
    w = history.of("app.service")
    w.record(1_000.0, [ThreadSample(100, 1, "hot", "workers", 1.0)], 0.0, 16, intervals=5)
    w.record_idle(1_001.0, intervals=3)
    summary = w.summary()
    assert w.samples == 8 and summary.samples == 8
    assert summary.threads[0].p50 > 0.9, "5 of 8 samples at a whole core: the median is hot"


def test_demand_reads_a_thread_as_cpu_bound_only_where_cpu_was_to_be_had():
    """On a saturated host (no idle CPU), a thread that never slept and waited is starved: its
    demand is unknown (what it got is returned, marked); one that slept got what it wanted."""
    demand = usage_tracker.demand
    assert demand(0.5, 0.5, 1.0, room_cpus=1.0) == (1.0, False)  # a spinner waiting while its CPUs idled
    assert demand(0.15, 0.85, 1.0, room_cpus=0.0) == (0.15, True)  # behind on fixed work, or a spinner: unknown
    assert demand(0.15, 0.6, 1.0, room_cpus=0.0) == (0.15, False)  # it slept 25 %: it got what it wanted
    assert demand(0.95, 0.05, 1.0, room_cpus=0.0) == (0.95, False)  # hardly waited: it ran all along
    assert demand(0.1, 0.3, 1.0, room_cpus=None) == (0.1, False)  # it slept 60 %: its waits only delayed it
    assert demand(0.15, 0.4, 1.0, room_cpus=1.0) == (0.15, False)  # queued behind siblings on a quiet host
    assert demand(0.66, 0.33, 1.0, room_cpus=None)[0] == pytest.approx(0.66 / 0.67)  # hardly slept: as before


def _crowded(history, label, threads, seconds=300):
    """threads: (comm, sample function of i) -> ThreadSample."""
    w = history.of(label)
    for i in range(seconds):
        w.record(float(i), [make(k, i) for k, make in enumerate(threads)], 0.0, 16)
    return w


def test_on_a_crowded_host_a_starved_spinner_gets_a_core_and_eight_starved_periodic_threads_do_not(tmp_path):
    """2 CPUs and 2 spinners beside: a spinner never sleeps (starved in every interval) while seven
    light threads sleep between their work: one core for it. Eight threads with 15 ms of work per
    100 ms, all behind: none is told hot, needed lies between what they got and the host's 2 CPUs,
    and the reason says starved."""
    history = UsageHistory(str(tmp_path / "h.json"), DAY, 16)
    spinner = [lambda k, i: ThreadSample(100, 1, "hot", None, 0.45, starved=True)]
    light = [lambda k, i: ThreadSample(100 + k, 1, f"light{k}", None, 0.1)] * 7
    r = rightsize(_crowded(history, "one-hot", spinner + light).summary(), Declared(None, "nothing", 2), 0.15)
    assert r.exclusive_cores == 1 and r.hot_threads[0]["comm"] == "hot" and r.hot_threads[0]["starved_got_cpus"] == 0.45
    assert r.needed_cpus <= 2 and r.starved_s > 200 and "starved" in r.reason

    even = [lambda k, i: ThreadSample(k, 1, f"even{k}", None, 0.11, starved=True)] * 8
    r = rightsize(_crowded(history, "eight", even).summary(), Declared(None, "nothing", 2), 0.15)
    got = 8 * 0.11
    assert r.exclusive_cores == 0 and r.hot_threads == ()
    assert got <= r.needed_cpus <= 2.0 and r.starved_got_cpus >= got - 0.05
    assert "starved 29" in r.reason and "do not fit the 2 CPUs" in r.reason


def test_no_recommendation_exceeds_the_cpus_it_may_run_on(tmp_path):
    history = UsageHistory(str(tmp_path / "h.json"), DAY, 16)
    busy = [lambda k, i: ThreadSample(k, 1, f"w{k}", None, 0.7)] * 8
    r = rightsize(_crowded(history, "busy", busy).summary(), Declared(None, "nothing", 2), 0.15)
    assert r.needed_cpus == 2.0 and r.per_container_cpus <= 2.0 and "capped at the 2 CPUs" in r.reason


def test_a_burst_that_finds_its_cpus_busy_is_still_hot_where_it_fits(tmp_path):
    """Busy 2 s in every 10 s, each burst starved (its CPUs busy): its p95 is unknown, not its idle
    seconds' zero; it fits beside the rest of a 2-CPU host, so it gets its core."""
    history = UsageHistory(str(tmp_path / "h.json"), DAY, 16)
    burst = [lambda k, i: ThreadSample(1, 1, "burst", None, 0.6 if i % 10 < 2 else 0.0, starved=i % 10 < 2)]
    r = rightsize(_crowded(history, "bursty", burst).summary(), Declared(None, "nothing", 2), 0.15)
    assert r.exclusive_cores == 1 and r.hot_threads[0]["comm"] == "burst" and r.hot_threads[0]["p95_cpus"] < 0.05
    assert "starved in 60 of 300 intervals" in r.reason


def test_light_threads_behind_on_their_own_pace_now_and_then_leave_the_spinner_its_core(tmp_path):
    """A crowded 2-CPU host: the spinner is starved in every interval; seven threads of 10 ms per
    100 ms fall behind in a quarter of theirs and then get about their pace (0.12, catching up).
    They are light by their measured p95, so the spinner's core fits: one exclusive core. Were
    they getting far more than their pace when starved (a burst), they might be hot, and eight
    such threads do not fit."""
    history = UsageHistory(str(tmp_path / "h.json"), DAY, 16)
    spinner = [lambda k, i: ThreadSample(100, 1, "hot", None, 0.45, starved=True)]
    behind = [lambda k, i: ThreadSample(100 + k, 1, f"light{k}", None, 0.12 if i % 4 == 0 else 0.1,
                                        starved=i % 4 == 0)] * 7
    r = rightsize(_crowded(history, "one-hot", spinner + behind).summary(), Declared(None, "nothing", 2), 0.15)
    assert r.exclusive_cores == 1 and [t["comm"] for t in r.hot_threads] == ["hot"], r.reason
    assert r.needed_cpus <= 2 and "starved" in r.reason

    bursting = [lambda k, i: ThreadSample(200 + k, 1, f"b{k}", None, 0.6 if i % 4 == 0 else 0.1,
                                          starved=i % 4 == 0)] * 7
    r = rightsize(_crowded(history, "bursts", spinner + bursting).summary(), Declared(None, "nothing", 2), 0.15)
    assert r.exclusive_cores == 0 and "do not fit the 2 CPUs" in r.reason, r.reason


def test_a_process_is_timed_by_its_own_read_not_by_the_late_samplers_pass(tmp_path, monkeypatch):
    """A process using one CPU, sampled by passes a second apart whose reads run late by varying
    amounts (a crowded host): what it used is read over the time between its own reads, so the
    residual stays one CPU instead of swinging with the sampler's lateness."""
    reads = iter([0.0, 1.4, 2.0, 3.3, 4.0])  # the clock at each read; the passes start at 0, 1, 2, 3, 4
    read_at = [0.0]

    def clock():
        return read_at[0]

    def counters(pid):
        read_at[0] = next(reads)
        return procfs.TaskStat(comm="app", state="R", ppid=1, flags=0, nice=0, start_time=1, last_cpu=0, policy=0,
                               cpu_ticks=int(round(read_at[0] * usage_tracker.CLOCK_TICKS)))

    monkeypatch.setattr(usage_tracker, "read_process_stat", counters)
    monkeypatch.setattr(usage_tracker.cgroups, "cpu_usage_us", lambda cgroup: None)
    history = UsageHistory(str(tmp_path / "h.json"), DAY, 16)
    settings = LearnerSettings(history_file=str(tmp_path / "h.json"), rightsizing=True)
    tracker = usage_tracker.UsageTracker(settings, history, energy=False, clock=clock)
    tracked = usage_tracker.Tracked(label="app.service", key="app.service")
    workload = Workload(key="app.service", profile_id=None, tier="standard", budget=None, budget_reason="",
                        source="binding", reason="test", unit="app.service", cgroup=None, pids=(4242,), threads=())
    for now in range(5):
        tracker.sample(tracked, workload, float(now))
    summary = history.of("app.service").summary()
    assert summary.samples == 5  # the first read starts the process's count
    assert 0.95 <= summary.rest_p95 <= 1.05, summary.rest_p95  # timed by the pass: 1.4 at p95
