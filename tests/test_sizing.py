"""Exclusive groups sized from what their threads use (decide/sizing.py): the hysteresis rule, and a
pool of four real busy workers measured the way the learner's thread measures them, then planned on
a 4-core machine shape (two whole cores) and on a 2-core one (demoted to shared CPUs, explain says why)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time

from fixture_shapes import load_fixture_shape
from thread_children import wait_for

from temperd.config.profile import parse_profile
from temperd.decide.matcher import ThreadMatch, Workload
from temperd.decide.planner import plan
from temperd.decide.sizing import (MIN_SAMPLES, NO_SIZING, GroupDemand, Sizing, cores_for, group_demands,
                                   member_counts, resize, sized_workloads)
from temperd.observe.usage_history import ThreadSample, WorkloadHistory
from temperd.observe.usage_tracker import wanted_cpus
from temperd.plan import CONFINED, EXCLUSIVE, LATENCY, OPEN, OWNED

HERE = os.path.dirname(os.path.abspath(__file__))

POOL = """
schema_version = 1
id = "pool"
[[thread_groups]]
name = "workers"
thread_names = ["worker*"]
treatment = "exclusive"
[[thread_groups]]
name = "rest"
catch_all = true
treatment = "yield"
"""


def test_cores_for_a_demand_and_the_hysteresis_of_a_resize():
    assert [cores_for(x) for x in (0.0, 0.3, 1.0, 1.04, 1.2, 1.8, 2.03, 2.2)] == [1, 1, 1, 1, 2, 2, 2, 3]
    assert resize(1.8, None) == 2
    assert resize(2.2, 2) == 3, "grows at once"
    assert resize(0.9, 2) == 2, "one core fewer would be 90 % busy: kept"
    assert resize(0.75, 2) == 1, "one core fewer is at most 80 % busy: shrinks"
    assert resize(0.5, 4) == 1
    for demand in (0.78, 0.8, 0.82, 0.95, 1.0, 1.04):  # near one core, after holding two: never flaps
        assert resize(demand, resize(demand, 2)) == resize(demand, 2)


def test_a_pool_that_fills_its_cores_gets_one_more_and_keeps_it():
    """Four PostgreSQL backends on the one core of `cpus = 1.0` measured 1.03 CPUs (what the core
    let them do; they waited twice that on its runqueue): sized by that, they stayed on it. A pool
    of more threads than cores that fills them gets one core more; a lone thread cannot use it."""
    assert cores_for(1.03, threads=4) == 2 and cores_for(1.03, threads=1) == 1 and cores_for(1.03) == 1
    assert cores_for(0.95, threads=4) == 2, "0.95 read on one core (buckets 5 % apart): full"
    assert cores_for(0.85, threads=4) == 1, "room left on its core"
    assert cores_for(1.97, threads=2) == 2, "as many cores as threads: nothing to queue behind"
    assert cores_for(1.97, threads=3) == 3
    assert resize(1.03, None, 4) == 2
    for demand in (0.82, 0.9, 0.95, 1.0, 1.04):  # near a full core, after holding two: never flaps
        assert resize(demand, resize(demand, 2, 4), 4) == resize(demand, 2, 4) == 2
    assert resize(0.7, 2, 4) == 1, "one core fewer is at most 80 % busy and not full: shrinks"
    assert resize(0.85, 2, 4) == 2, "not full on one core, but one core fewer would be 85 % busy: kept"

    shape = load_fixture_shape("this-host")  # 2 cores
    w = pool_workload((101, 102, 103, 104), budget=1.0)
    profiles = {"pool": parse_profile(POOL, "pool.toml")}
    measured = {(w.key, "workers"): GroupDemand(1.03, MIN_SAMPLES, 39.0)}
    sizing = Sizing(measured, {}, {(w.key, "workers"): 4})
    result = plan(shape, [w], profiles, sizing=sizing)
    layer = workers(result)
    assert (layer.kind, layer.treatment) == (OPEN, LATENCY), "not kept on the one core it fills"
    assert any("4 threads would fill 1 whole core(s) and queue there, so one more: 2 whole core(s)" in r
               for r in layer.reasons), layer.reasons
    assert sizing.sizes() == {(w.key, "workers"): 2}
    assert member_counts([w], measured) == {(w.key, "workers"): 4}, "what the daemon gives Sizing"
    alone = Sizing(measured, {}, {(w.key, "workers"): 1})  # one thread at a full core: its core
    assert len(workers(plan(shape, [w], profiles, sizing=alone)).cpus) == 1


def test_threads_starved_on_their_cores_count_at_least_what_they_got():
    """ONNX Runtime's two spinning intra-op threads on the one core of `cpus = 1.0`: runnable all
    along, each got half the core, starved in every sample. Their p95 leaves those samples out
    (0.05 CPUs from the few others), which kept them there; what they got is a floor."""
    history = WorkloadHistory("onnx", half_life_s=3600.0)
    for i in range(40):
        starved = i >= 2
        history.record(float(i), [ThreadSample(10 + n, 0, "python", "intra-op", 0.5 if starved else 0.05, starved)
                                  for n in range(2)] + [ThreadSample(20, 0, "python", "intra-op", 0.0)], 0.0, keep=16)
    demand = group_demands(history.summary())["intra-op"]
    assert 0.95 <= demand.cpus <= 1.05 and demand.starved, demand
    assert "starved threads counted at what they got" in demand.describe()
    key = ("onnx.service", "intra-op")
    assert Sizing({key: demand}, {}, {key: 3}).sizes() == {key: 2}, "three threads filling one core"
    once = WorkloadHistory("quiet", half_life_s=3600.0)  # starved in one sample of 40: its p95 stands
    for i in range(40):
        once.record(float(i), [ThreadSample(10, 0, "loop", "hot", 0.9 if i == 5 else 0.3, i == 5)], 0.0, keep=16)
    quiet = group_demands(once.summary())["hot"]
    assert quiet.cpus < 0.5 and not quiet.starved, quiet


def test_a_thread_that_turned_hot_is_not_counted_twice():
    """The event loop of a lone-client redis: 0.5 of a CPU at first (in the rest of its group),
    then crowded to 0.95 (hot, kept apart): its group needs one core, not two."""
    history = WorkloadHistory("svc", half_life_s=3600.0)
    for i in range(40):
        history.record(float(i), [ThreadSample(7, 0, "loop", "event-loop", 0.5 if i < 20 else 0.95)], 0.0, keep=16)
    demand = group_demands(history.summary())["event-loop"]
    assert 0.9 <= demand.cpus <= 1.0 and cores_for(demand.cpus) == 1


def test_measured_sizing_counts_only_after_enough_samples_and_a_pool_over_its_budget_is_demoted():
    shape = load_fixture_shape("gcp-c2-standard-8")
    w = pool_workload((101, 102, 103, 104), budget=1.0)
    profiles = {"pool": parse_profile(POOL, "pool.toml")}
    few = Sizing({(w.key, "workers"): GroupDemand(1.8, MIN_SAMPLES - 1, 10.0)}, {})
    layer = workers(plan(shape, [w], profiles, sizing=few))
    assert len(layer.cpus) == 1 and any(f"{MIN_SAMPLES - 1} of {MIN_SAMPLES} samples" in r for r in layer.reasons)
    enough = Sizing({(w.key, "workers"): GroupDemand(1.8, MIN_SAMPLES, 30.0)}, {})
    layer = workers(plan(shape, [w], profiles, sizing=enough))
    assert (layer.kind, layer.treatment) == (OPEN, LATENCY), "two cores needed, one in the budget: not pinned to one"
    assert any("measured p95 1.80 CPUs" in r for r in layer.reasons)
    assert any("needs 2 whole core(s), more than its budget gives (ceil(1 CPUs" in r for r in layer.reasons)
    within = Sizing({(w.key, "workers"): GroupDemand(0.7, MIN_SAMPLES, 30.0)}, {})
    assert len(workers(plan(shape, [w], profiles, sizing=within)).cpus) == 1
    assert enough.sizes() == {(w.key, "workers"): 2}
    assert few.sizes() == {}, "too few samples: no size, and no replan asked for"
    cooled = Sizing({(w.key, "workers"): GroupDemand(0.9, 60, 60.0)}, enough.sizes())
    assert cooled.sizes() == {(w.key, "workers"): 2}, "0.9 CPUs on one core would be 90 % busy: kept at 2"
    assert Sizing(cooled.demand, {}).sizes() == {(w.key, "workers"): 1}


def test_four_busy_workers_get_two_cores_on_a_4_core_shape_and_are_demoted_on_a_2_core_one():
    """Four real workers at 40 % each (1.6 CPUs together: clear of 2.0, where a third core would
    be needed, by more than a busy host's sampling noise), sampled from /proc like the usage
    thread samples them (the share each wanted of the time it was not kept waiting)."""
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, f"worker{i}"], stdout=subprocess.PIPE, text=True)
             for i in range(4)]
    try:
        for proc in procs:
            assert proc.stdout.readline().strip() == "ready"
        tids = [proc.pid for proc in procs]
        history = WorkloadHistory("pool", half_life_s=3600.0)
        sample_into(history, tids, samples=MIN_SAMPLES, run_s=0.1)  # 2.5 of their 40 ms bursts
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    demand = group_demands(history.summary())["workers"]
    assert 1.05 < demand.cpus < 2.05, f"four workers at 40 % measured as {demand.cpus} CPUs"
    assert demand.samples >= MIN_SAMPLES
    w = pool_workload(tuple(sorted(tids)))
    profiles = {"pool": parse_profile(POOL, "pool.toml")}
    sizing = Sizing({(w.key, "workers"): demand}, {})

    four = load_fixture_shape("gcp-c2-standard-8")
    assert len(four.cores) == 4
    layer = workers(plan(four, [w], profiles, sizing=sizing))
    assert (layer.kind, layer.treatment, layer.ownership, len(layer.cpus)) == (CONFINED, EXCLUSIVE, OWNED, 2)
    assert len({four.core_of(cpu).core_key for cpu in layer.cpus}) == 2
    assert any(demand.describe() in r and "2 whole core(s)" in r for r in layer.reasons)
    without = workers(plan(four, [w], profiles, sizing=NO_SIZING))
    assert without.kind == OPEN, "sized one core per member, the pool would not fit the 4-core shape either"

    two = load_fixture_shape("this-host")
    assert len(two.cores) == 2
    result = plan(two, [w], profiles, sizing=sizing)
    layer = workers(result)
    assert (layer.kind, layer.treatment, layer.cpus) == (OPEN, LATENCY, ())
    assert any("demoted to shared CPUs" in d and "needs 2 whole core(s), only 1 left" in d
               for d in result.decisions)


def pool_workload(tids, budget=None) -> Workload:
    threads = tuple(ThreadMatch(tid, tids[0], f"worker{i}", "workers", "test") for i, tid in enumerate(tids))
    return Workload(key="pool.service", profile_id="pool", tier="critical", budget=budget,
                    budget_reason="test budget" if budget else "no CPU budget", source="binding", reason="test",
                    unit="pool.service", cgroup="/system.slice/pool.service", pids=(tids[0],), threads=threads)


def test_only_workloads_with_an_exclusive_group_are_sized():
    yielding = parse_profile(POOL.replace('id = "pool"', 'id = "bg"').replace('"exclusive"', '"yield"'), "bg.toml")
    profiles = {"pool": parse_profile(POOL, "pool.toml"), "bg": yielding}
    pool = pool_workload([10, 11])
    background = dataclasses.replace(pool, key="bg.service", profile_id="bg")
    unknown = dataclasses.replace(pool, key="gone.service", profile_id="gone")
    assert sized_workloads([pool, background, unknown], profiles) == [pool]


def workers(layer_plan):
    (layer,) = [l for l in layer_plan.layers if l.group == "workers"]
    return layer


# One worker of the pool: busy for 45 ms of wall time, then 55 ms asleep, for at most a minute.
# Busy by the clock, not by work done: on a crowded host it wants no more than 0.45 of a CPU
# (the share it ran of the time it was not kept waiting), never a spinner's 1.0.
WORKER = """
import ctypes, sys, time
ctypes.CDLL(None).prctl(15, sys.argv[1].encode(), 0, 0, 0)
print("ready", flush=True)
end = time.monotonic() + 60
while time.monotonic() < end:
    busy = time.monotonic() + 0.040
    while time.monotonic() < busy:
        pass
    time.sleep(0.060)
"""


def sample_into(history: WorkloadHistory, tids, samples: int, run_s: float) -> None:
    """`samples` samples of the threads into history, each window ending once every thread ran
    run_s in it (a crowded host makes the windows longer, never thinner)."""
    def read():
        out = {}
        for tid in tids:
            with open(f"/proc/{tid}/schedstat") as handle:
                ran, waited, _ = (int(x) for x in handle.read().split())
            out[tid] = (ran, waited)
        return out, time.monotonic()

    before, at = read()
    for _ in range(samples):
        wait_for(lambda: min(read()[0][tid][0] - before[tid][0] for tid in tids) >= run_s * 1e9, 10,
                 f"{run_s} s run by each of {tids}", step=0.01)
        now, now_at = read()
        span = now_at - at
        history.record(now_at, [ThreadSample(tid, 0, f"worker{i}", "workers",
                                             wanted_cpus((now[tid][0] - before[tid][0]) / 1e9,
                                                         (now[tid][1] - before[tid][1]) / 1e9, span))
                                for i, tid in enumerate(tids)], 0.0, keep=16)
        before, at = now, now_at


def test_a_history_loaded_at_start_sizes_the_first_plan(tmp_path):
    """temperd plans before the learner's thread first samples: the group's demand comes from the
    history file it loaded, labelled like the matched workload."""
    from temperd.config.daemon_config import LearnerSettings
    from temperd.observe.learner import WorkloadLearner, workload_labels

    w = pool_workload((101, 102, 103, 104))
    label = workload_labels([w], lambda _w: False)[w.key]
    earlier = WorkloadLearner(LearnerSettings(history_file=str(tmp_path / "h.json")), 2, lambda: ((), None, {}))
    history = earlier.history.of(label)
    for i in range(MIN_SAMPLES):
        history.record(float(i), [ThreadSample(100 + n, 0, f"worker{n}", "workers", 0.45) for n in range(4)], 0.0,
                       keep=16)
    earlier.save()
    watch = WorkloadLearner(LearnerSettings(history_file=str(tmp_path / "h.json")), 2, lambda: ((), None, {}))
    watch.history.load()
    demand = watch.group_demands([w])[(w.key, "workers")]
    assert demand.samples >= MIN_SAMPLES and 1.7 <= demand.cpus <= 2.0  # histogram buckets: a few % coarse
    sized = workers(plan(load_fixture_shape("gcp-c2-standard-8"), [w], {"pool": parse_profile(POOL, "pool.toml")},
                         sizing=Sizing(watch.group_demands([w]), {})))
    assert len(sized.cpus) == 2
