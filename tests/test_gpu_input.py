"""A GPU that waits for its input, from a recorded NVML reading (no GPU on the test host): a
ResNet-18 trainer on an H200 (16 CPU cores) whose 8 DataLoader workers each wanted a whole CPU
while the GPU was busy 16 % of the time (bench/gpu_input.py recorded it; with 14 workers the GPU
was busy 25 % and the trainer 1.48x as fast). The per-process samples NVML keeps are the measure:
the device's own utilisation is one short sample, 0 or 100 at each look."""

from __future__ import annotations

import json
import os

from temperd.decide import classify as C
from temperd.observe import workload_window as W
from temperd.control.typed_json import from_json
from temperd.sources.nvml import GpuReading, workload_gpu

RECORDED = os.path.join(os.path.dirname(__file__), "fixtures", "nvml", "h200-resnet18-dataloader.json")


def recorded():
    with open(RECORDED) as handle:
        return json.load(handle)["runs"]


def test_the_recorded_readings_give_the_trainers_own_gpu_share_over_the_window():
    run = recorded()[0]
    readings = [from_json(GpuReading, r) for r in run["nvml_readings"]]
    trainer, worker = run["trainer_pid"], run["trainer_pid"] + 27
    window = W.Window()
    counters = W.Counters(sampled=True, threads={trainer: W.ThreadTotals(pid=trainer), worker: W.ThreadTotals(pid=worker)})
    start = readings[0].at
    for reading in readings:
        elapsed = reading.at - start
        # the trainer's main thread a tenth of a CPU, one worker (holding no GPU) a whole CPU
        counters.threads[trainer].demand_s, counters.threads[worker].demand_s = 0.1 * elapsed, 1.0 * elapsed
        counters.demand_s = 1.1 * elapsed
        window.add(W.snapshot(reading.at, counters, {}, {}, None, None, gpu=workload_gpu(reading, [trainer, worker])),
                   600.0)
    s = W.signals("trainer", window, window_goal_s=600.0, tier="standard", capacity_limit=16, hints=C.Hints(),
                  missing={}, delayacct=False, gpu_present=True, host_cpus=16)
    assert 9.0 < s.get(C.GPU_UTIL) < 20.0 and 2.0 < s.get(C.GPU_MEMORY_UTIL) < 7.0  # start-up at 0-1 % included
    assert s.get(C.INPUT_WORKERS) == 1 and abs(s.get(C.INPUT_WORKER_CPUS) - 1.0) < 0.01
    assert workload_gpu(readings[-1], [worker]) is None  # a worker holds no GPU
    assert "nvml" in s.sources


def test_the_recorded_trainer_is_input_bound_and_told_how_many_cpus_its_workers_need():
    eight, fourteen = recorded()
    c = C.classify(C.WorkloadSignals("trainer", 40.0, 45.0, measured=eight["measured"], sources=("schedstat", "nvml"),
                                     gpu_present=True))
    assert (c.gpu_intensity, c.gpu_bound) == ("low", "input")
    assert c.input_bound is not None and c.input_bound.workers == 8 and c.input_bound.more_cpus == 7
    assert "input-bound: its DataLoader workers need 7 more CPUs (GPU busy 16% < 50%" in c.reason
    assert "beyond this host's 16 CPUs" in c.reason  # 44 CPUs by the idle share: capped at the host
    assert c.as_json()["gpu"]["inputBound"]["more_cpus"] == 7 and c.as_json()["gpu"]["memoryUtilizationPct"] == 5.0
    # more workers, a busier GPU: fewer CPUs left to ask for on this host
    more = C.classify(C.WorkloadSignals("trainer", 40.0, 45.0, measured=fourteen["measured"],
                                        sources=("schedstat", "nvml"), gpu_present=True))
    assert more.gpu_bound == "input" and more.input_bound.more_cpus < c.input_bound.more_cpus
    assert fourteen["images_per_s"] > 1.3 * eight["images_per_s"]


def test_a_busy_gpu_or_workers_that_sleep_are_not_input_bound():
    base = dict(recorded()[0]["measured"])
    busy = C.classify(C.WorkloadSignals("t", 40, 45, measured={**base, C.GPU_UTIL: 85.0}, gpu_present=True))
    assert busy.gpu_bound == "compute" and busy.input_bound is None
    idle_workers = C.classify(C.WorkloadSignals("t", 40, 45, measured={**base, C.INPUT_WORKER_CPUS: 2.0},
                                                gpu_present=True))
    assert idle_workers.input_bound is None
    none = C.classify(C.WorkloadSignals("t", 40, 45, measured={C.CPU_DEMAND: 1.0, C.CPU_CAPACITY: 1}))
    assert none.gpu_bound == "none" and "no NVIDIA GPU or NVML on this host" in none.reason


def test_rightsize_says_it_first():
    from temperd.decide.rightsize import Declared, UsageSummary, rightsize
    c = C.classify(C.WorkloadSignals("trainer", 40.0, 45.0, measured=recorded()[0]["measured"], gpu_present=True))
    r = rightsize(UsageSummary("trainer", (), 0.4, 8.5, 8.8, 8.9, 56.0, 56), Declared(None, "none", 16), 0.15,
                  profile="trainer", input_bound=c.input_bound)
    assert r.reason.startswith("input-bound: its DataLoader workers need 7 more CPUs")
    assert r.as_json()["input_bound"]["more_cpus"] == 7 and r.profile == "trainer"


def test_a_full_window_covers_its_goal_though_the_snapshots_come_a_little_late():
    """Snapshots every 5 s plus a little: a 30 s window spans at least 30 s once it is full (the
    first snapshot inside it would leave it 25 s for good), and until then all there is."""
    window, counters = W.Window(), W.Counters(sampled=True)
    at = 100.0
    spans = []
    for _ in range(12):
        window.add(W.snapshot(at, counters, {}, {}, None, None), 30.0)
        first, last = window.span(30.0) or (None, None)
        spans.append(round(last.at - first.at, 2) if first else None)
        at += 5.02
    assert spans[:3] == [None, 5.02, 10.04]
    assert all(30.0 <= span < 35.1 for span in spans[7:]), spans
