"""What kind of workload is this: a pure function from measured signals (and hints) to a
classification in the workload-profile vocabulary (criticality, cpu.intensity / bound /
avgUtilizationPct / capSensitivity, gpu.*), with an audit trail naming every threshold that fired
and a confidence that says how much the host could measure.

Nothing is read here: observe/workload_signals.py gathers WorkloadSignals over the [classify]
window from the sources (schedstat, /proc/PID/io, task states, delay accounting, cgroup and host
PSI, memory.current against its limit, perf events, RAPL, NVML); a trained profile's [traits]
come from the same function.

Thresholds: intensity high >= 75 %, medium >= 30 % and compute when utilisation > 65 % (as the
Joulie classifier); unlike it, io and memory are measured (pressure stall information, sleeps in D
state, faults, hardware counters) rather than inferred from low CPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Dict, List, Mapping, Optional, Tuple

from temperd.config.profile import Traits

# ---- signal names (WorkloadSignals.measured keys) ---------------------------------------------
CPU_DEMAND = "cpu.demand_cpus"  # the CPUs its threads wanted: on-CPU time over the time not kept waiting
CPU_USED = "cpu.used_cpus"  # on-CPU only
CPU_CAPACITY = "cpu.capacity_cpus"  # what avgUtilizationPct is a share of
HOT_THREADS = "cpu.hot_threads"  # threads whose average demand is >= HOT_THREAD_CPUS, mostly not stalled
BUSIEST_THREAD = "cpu.busiest_thread_cpus"
PSI_CPU = "psi.cgroup.cpu_some_pct"
PSI_MEMORY = "psi.cgroup.memory_some_pct"
PSI_MEMORY_FULL = "psi.cgroup.memory_full_pct"
PSI_IO = "psi.cgroup.io_some_pct"
PSI_IO_FULL = "psi.cgroup.io_full_pct"
HOST_PSI_CPU = "psi.host.cpu_some_pct"
HOST_PSI_MEMORY = "psi.host.memory_some_pct"
HOST_PSI_IO = "psi.host.io_some_pct"
D_STATE_SHARE = "sched.d_state_sleep_share"  # sampled sleeps that were uninterruptible (D)
IO_BYTES = "io.bytes_per_s"  # /proc/PID/io read_bytes + write_bytes
MAJOR_FAULTS = "mem.major_faults_per_s"
MEMORY_USE = "mem.use_of_limit"  # memory.current / (memory.high or memory.max)
BLKIO_DELAY = "delayacct.blkio_pct"  # block I/O delay, % of wall (delay accounting)
IPC = "perf.ipc"
LLC_MISSES = "perf.llc_misses_per_kinstr"
RAPL_DRAM_RATIO = "rapl.dram_energy_ratio"
GPU_UTIL = "gpu.util_pct"
GPU_MEMORY_UTIL = "gpu.memory_util_pct"

# Each source and what it contributes to the confidence (all of them: 1.0).
SOURCE_WEIGHTS = {
    "schedstat": 0.45,  # on-CPU and runqueue time of every thread
    "psi": 0.15,  # the workload cgroup's cpu/memory/io pressure
    "proc_io": 0.05,  # /proc/PID/io and fault counters
    "task_state": 0.05,  # sampled D-state sleeps
    "delayacct": 0.05,  # kernel.task_delayacct
    "perf": 0.15,  # IPC, last-level cache misses (needs a PMU)
    "rapl": 0.05,  # package / DRAM energy (needs powercap)
    "nvml": 0.05,  # NVIDIA GPUs
}
HINTS_ONLY_CONFIDENCE = 0.3  # nothing measured: the hints are all there is
HINT_BONUS = 0.05
MIN_COVERAGE_FACTOR = 0.4  # a window just begun still counts for this much

# ---- thresholds --------------------------------------------------------------------------------
INTENSITY_HIGH_PCT = 75.0
INTENSITY_MEDIUM_PCT = 30.0
COMPUTE_UTIL_PCT = 65.0
HOT_THREAD_CPUS = 0.8  # a thread this busy needs a core of its own (rightsizing's threshold too)
PRESSURE_PCT = 10.0  # PSI "some" share of the window that makes a resource the constraint
OWN_IO_BYTES_PER_S = 64 * 1024  # less storage I/O of its own than this: io pressure comes from paging
D_STATE_IO_SHARE = 0.5  # half the sampled sleeps in D, while doing I/O
BLKIO_DELAY_PCT = 20.0
MAJOR_FAULTS_PER_S = 100.0
MEMORY_USE_TIGHT = 0.9  # with some memory pressure, a workload at its limit is memory-bound
MEMORY_USE_PRESSURE_PCT = 2.0
LOW_IPC = 0.7
HIGH_LLC_MISSES = 10.0
RAPL_DRAM_MEMORY = 0.40
CAP_SENSITIVE_UTIL_PCT = 70.0
GPU_HIGH_PCT = 70.0
GPU_MEDIUM_PCT = 30.0
GPU_MEMORY_BOUND_PCT = 60.0

CRITICALITIES = ("performance", "standard")
LEVELS = ("high", "medium", "low")
CPU_BOUNDS = ("compute", "memory", "io", "mixed")


@dataclass(frozen=True)
class Hints:
    """Values that override measurement: a profile's [traits] (or a binding's), and where they
    came from ("profile redis [traits]")."""

    source: str = ""
    traits: Traits = Traits()

    def get(self, name: str) -> Optional[str]:
        return getattr(self.traits, name)

    def any(self) -> bool:
        return any(self.get(name) is not None for name in _HINT_FIELDS)


_HINT_FIELDS = tuple(f.name for f in fields(Traits))


@dataclass(frozen=True)
class WorkloadSignals:
    """What was measured of one workload over a window.

    measured: signal name (the constants above) -> value; sources: the sources that gave them
    (SOURCE_WEIGHTS keys); missing: source -> why the host could not give it ("no PMU")."""

    workload: str
    window_s: float  # how long the measurements cover
    window_goal_s: float  # the configured window ([classify] window_s)
    tier: str = "standard"
    measured: Mapping[str, float] = field(default_factory=dict)
    sources: Tuple[str, ...] = ()
    missing: Mapping[str, str] = field(default_factory=dict)
    hints: Hints = Hints()
    gpu_present: bool = False  # an NVIDIA GPU and NVML were found on the host

    def get(self, name: str) -> Optional[float]:
        return self.measured.get(name)


@dataclass(frozen=True)
class Classification:
    workload: str
    criticality: str
    cpu_intensity: str
    cpu_bound: str
    cpu_avg_utilization_pct: Optional[float]
    cpu_cap_sensitivity: str
    gpu_intensity: str
    gpu_bound: str
    gpu_avg_utilization_pct: Optional[float]
    gpu_cap_sensitivity: str
    reason: str  # "cpu-intensity=high (util 98% >= 75%); cpu-bound=compute (...); ..."
    confidence: float  # 0..1: how much could be measured, and for how long
    window_s: float
    signals: Tuple[Dict[str, object], ...]  # each used signal and each missing source

    def as_json(self) -> Dict[str, object]:
        """The workload-profile status shape."""
        return {
            "workload": self.workload,
            "criticality": {"class": self.criticality},
            "cpu": {"intensity": self.cpu_intensity, "bound": self.cpu_bound,
                    "avgUtilizationPct": self.cpu_avg_utilization_pct, "capSensitivity": self.cpu_cap_sensitivity},
            "gpu": {"intensity": self.gpu_intensity, "bound": self.gpu_bound,
                    "avgUtilizationPct": self.gpu_avg_utilization_pct, "capSensitivity": self.gpu_cap_sensitivity},
            "classificationReason": self.reason,
            "confidence": self.confidence,
            "window_s": self.window_s,
            "signals": list(self.signals),
        }


def _pct(value: float) -> str:
    return f"{value:.0f}%" if value >= 10 else f"{value:.1f}%"


class _Trail:
    """The reason, one clause per decision."""

    def __init__(self, hints: Hints):
        self.hints = hints
        self.clauses: List[str] = []

    def decide(self, key: str, hint_field: str, measured: str, why: str) -> str:
        """The hint where one is given (marked "(hint)", the measured value beside it), else the measured one."""
        hinted = self.hints.get(hint_field)
        if hinted is not None and hinted != measured:
            self.clauses.append(f"{key}={hinted} (hint: {self.hints.source}; measured {measured}: {why})")
            return hinted
        if hinted is not None:
            self.clauses.append(f"{key}={hinted} (hint: {self.hints.source}; measured the same: {why})")
            return hinted
        self.clauses.append(f"{key}={measured} ({why})")
        return measured

    def note(self, text: str) -> None:
        self.clauses.append(text)


def utilization_pct(s: WorkloadSignals) -> Optional[float]:
    """CPU demand as a share of the CPUs the workload can use (capacity: declared CPUs, else its
    active threads up to the host's CPUs)."""
    demand, capacity = s.get(CPU_DEMAND), s.get(CPU_CAPACITY)
    if demand is None or not capacity:
        return None
    return min(100.0, 100.0 * demand / capacity)


def _intensity(util: Optional[float]) -> Tuple[str, str]:
    if util is None:
        return "low", "no CPU measurement"
    if util >= INTENSITY_HIGH_PCT:
        return "high", f"util {_pct(util)} >= {INTENSITY_HIGH_PCT:.0f}%"
    if util >= INTENSITY_MEDIUM_PCT:
        return "medium", f"util {_pct(util)} >= {INTENSITY_MEDIUM_PCT:.0f}%"
    return "low", f"util {_pct(util)} < {INTENSITY_MEDIUM_PCT:.0f}%"


def _bound_evidence(s: WorkloadSignals, util: Optional[float]) -> Dict[str, List[str]]:
    """Each resource that constrains the workload and the measurements that say so."""
    found: Dict[str, List[str]] = {"compute": [], "memory": [], "io": []}
    hot, busiest = s.get(HOT_THREADS), s.get(BUSIEST_THREAD)
    memory_psi, io_psi = s.get(PSI_MEMORY), s.get(PSI_IO)
    stalled = max(memory_psi or 0.0, io_psi or 0.0) >= PRESSURE_PCT
    if util is not None and util > COMPUTE_UTIL_PCT and not stalled:  # CPU spent while stalling is not compute
        found["compute"].append(f"util {_pct(util)} > {COMPUTE_UTIL_PCT:.0f}%")
    if hot and busiest is not None:
        found["compute"].append(f"{hot:.0f} hot thread(s), busiest {busiest:.2f} CPU >= {HOT_THREAD_CPUS}")
    if memory_psi is not None and memory_psi >= PRESSURE_PCT:
        found["memory"].append(f"memory pressure {_pct(memory_psi)} >= {PRESSURE_PCT:.0f}% of the window")
    faults = s.get(MAJOR_FAULTS)
    if faults is not None and faults >= MAJOR_FAULTS_PER_S:
        found["memory"].append(f"major faults {faults:.0f}/s >= {MAJOR_FAULTS_PER_S:.0f}/s")
    use = s.get(MEMORY_USE)
    if use is not None and use >= MEMORY_USE_TIGHT and (memory_psi or 0.0) >= MEMORY_USE_PRESSURE_PCT:
        found["memory"].append(f"memory at {use:.0%} of its limit >= {MEMORY_USE_TIGHT:.0%} with pressure "
                               f"{_pct(memory_psi or 0.0)}")
    ipc, llc = s.get(IPC), s.get(LLC_MISSES)
    if ipc is not None and llc is not None and ipc < LOW_IPC and llc >= HIGH_LLC_MISSES:
        found["memory"].append(f"IPC {ipc:.2f} < {LOW_IPC} with {llc:.0f} LLC misses/kinstr >= {HIGH_LLC_MISSES:.0f}")
    dram = s.get(RAPL_DRAM_RATIO)
    if dram is not None and dram > RAPL_DRAM_MEMORY:
        found["memory"].append(f"DRAM energy ratio {dram:.2f} > {RAPL_DRAM_MEMORY}")
    d_share, io_bytes = s.get(D_STATE_SHARE), s.get(IO_BYTES)
    # Swap-ins stall as memory and as io at once, sleep in D state, and a swap file's reads may count
    # as the task's own I/O: memory stalling at least as much as io, with the faults to feed it, is
    # paging, whatever the io signals say.
    swapping = ((faults or 0.0) >= MAJOR_FAULTS_PER_S
                and (memory_psi or 0.0) >= max(io_psi or 0.0, PRESSURE_PCT))
    paging = False  # the io signals below are swap-ins and refaults: memory's doing, not storage's
    if io_psi is not None and io_psi >= PRESSURE_PCT:
        if io_bytes is not None and io_bytes < OWN_IO_BYTES_PER_S:
            paging = bool(found["memory"])
            found["memory" if paging else "io"].append(
                f"io pressure {_pct(io_psi)} >= {PRESSURE_PCT:.0f}% with only "
                f"{_bytes(io_bytes)}/s of its own storage I/O (paging)")
        elif swapping:
            paging = True
            found["memory"].append(f"io pressure {_pct(io_psi)} no larger than memory pressure "
                                   f"{_pct(memory_psi or 0.0)}, with {faults:.0f} major faults/s (paging)")
        else:
            found["io"].append(f"io pressure {_pct(io_psi)} >= {PRESSURE_PCT:.0f}% of the window")
    paging = paging or swapping
    if d_share is not None and d_share >= D_STATE_IO_SHARE and (io_bytes or 0.0) > 0:
        # A task that faults its pages back in sleeps in D state on that I/O too.
        found["memory" if paging else "io"].append(
            f"{d_share:.0%} of sampled sleeps in D state >= {D_STATE_IO_SHARE:.0%} "
            f"with {_bytes(io_bytes or 0.0)}/s of I/O{' (paging)' if paging else ''}")
    blkio = s.get(BLKIO_DELAY)
    if blkio is not None and blkio >= BLKIO_DELAY_PCT:
        found["io"].append(f"block I/O delay {_pct(blkio)} >= {BLKIO_DELAY_PCT:.0f}%")
    return {k: v for k, v in found.items() if v}


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _bound(evidence: Dict[str, List[str]], util: Optional[float]) -> Tuple[str, str]:
    if len(evidence) == 1:
        (kind, why), = evidence.items()
        return kind, "; ".join(why)
    if len(evidence) > 1:
        return "mixed", " and ".join(f"{kind}: {', '.join(why)}" for kind, why in sorted(evidence.items()))
    util_text = f"util {_pct(util)}" if util is not None else "no CPU measurement"
    return "mixed", f"no resource dominates: {util_text}, no pressure, stall or fault threshold crossed"


def _cap_sensitivity(bound: str, util: Optional[float], hot: float) -> Tuple[str, str]:
    if bound == "compute" and util is not None and util > CAP_SENSITIVE_UTIL_PCT:
        return "high", f"compute-bound, util {_pct(util)} > {CAP_SENSITIVE_UTIL_PCT:.0f}%"
    if hot:
        return ("high" if bound == "compute" else "medium"), f"{hot:.0f} hot thread(s) slow down with the cap"
    if bound == "compute":
        return "medium", f"compute-bound, util {_pct(util or 0.0)} <= {CAP_SENSITIVE_UTIL_PCT:.0f}%"
    if bound == "mixed" and util is not None and util >= INTENSITY_MEDIUM_PCT:
        return "medium", f"mixed, util {_pct(util)} >= {INTENSITY_MEDIUM_PCT:.0f}%"
    return "low", f"{bound}-bound" if bound != "mixed" else "little CPU demand"


def _gpu(s: WorkloadSignals) -> Tuple[str, str, Optional[float], str, str]:
    util = s.get(GPU_UTIL)
    if util is None:
        why = "no NVIDIA GPU or NVML on this host" if not s.gpu_present else "no GPU use by its processes"
        return "none", "none", None, "none", why
    memory = s.get(GPU_MEMORY_UTIL)
    level = "high" if util >= GPU_HIGH_PCT else "medium" if util >= GPU_MEDIUM_PCT else "low"
    bound = "memory" if memory is not None and memory >= GPU_MEMORY_BOUND_PCT and memory > util else "compute"
    sensitivity = "high" if level == "high" and bound == "compute" else "medium" if level != "low" else "low"
    why = f"util {_pct(util)}" + (f", memory util {_pct(memory)}" if memory is not None else "")
    return level, bound, util, sensitivity, why


def confidence_of(s: WorkloadSignals) -> float:
    """The weight of the sources that gave data, scaled by how much of the window they cover;
    HINTS_ONLY_CONFIDENCE where nothing was measured."""
    measured = sum(SOURCE_WEIGHTS.get(source, 0.0) for source in set(s.sources))
    if measured <= 0:
        return HINTS_ONLY_CONFIDENCE if s.hints.any() else 0.0
    coverage = min(1.0, s.window_s / s.window_goal_s) if s.window_goal_s > 0 else 1.0
    score = measured * (MIN_COVERAGE_FACTOR + (1 - MIN_COVERAGE_FACTOR) * coverage)
    if s.hints.any():
        score += HINT_BONUS
    return round(min(1.0, score), 2)


def _signal_list(s: WorkloadSignals) -> Tuple[Dict[str, object], ...]:
    used = [{"name": name, "value": round(value, 4)} for name, value in sorted(s.measured.items())]
    missing = [{"name": source, "missing": why} for source, why in sorted(s.missing.items())]
    return tuple(used + missing)


def classify(signals: WorkloadSignals) -> Classification:
    """Classify one workload from what was measured of it.

    criticality: performance for the critical tier, else standard; cpu.intensity from the
    utilisation (demand / capacity); cpu.bound: every resource whose threshold fired (compute:
    utilisation or a hot thread; memory: memory pressure, major faults, use at the limit under
    pressure, low IPC with cache misses, DRAM energy; io: io pressure, D-state sleeps with I/O,
    block I/O delay), "mixed" where more than one fired or none did; capSensitivity from the
    bound, utilisation and hot threads; gpu.* from NVML, "none" without a GPU. Hints (profile
    [traits], a binding's traits) override each field they name, marked "(hint)" in the reason.
    The reason names every threshold that fired with its measured value, the window, and the
    sources that were missing; the confidence is lower for a short window or missing sources."""
    s = signals
    trail = _Trail(s.hints)
    util = utilization_pct(s)
    hot = s.get(HOT_THREADS) or 0.0

    tier_class = "performance" if s.tier == "critical" else "standard"
    criticality = trail.decide("criticality", "criticality", tier_class, f"tier {s.tier}")
    measured_intensity, why = _intensity(util)
    intensity = trail.decide("cpu-intensity", "cpu_intensity", measured_intensity, why)
    measured_bound, why = _bound(_bound_evidence(s, util), util)
    bound = trail.decide("cpu-bound", "cpu_bound", measured_bound, why)
    measured_cap, why = _cap_sensitivity(bound, util, hot)
    cap = trail.decide("cpu-cap-sensitivity", "cpu_cap_sensitivity", measured_cap, why)
    gpu_level, gpu_bound_measured, gpu_util, gpu_cap, gpu_why = _gpu(s)
    gpu_hinted = any(s.hints.get(name) is not None for name in _HINT_FIELDS if name.startswith("gpu"))
    if gpu_util is None and not gpu_hinted:
        trail.note(f"gpu=none ({gpu_why})")
        gpu_intensity = gpu_bound = gpu_sensitivity = "none"
    else:
        gpu_intensity = trail.decide("gpu-intensity", "gpu_intensity", gpu_level, gpu_why)
        gpu_bound = trail.decide("gpu-bound", "gpu_bound", gpu_bound_measured, gpu_why)
        gpu_sensitivity = trail.decide("gpu-cap-sensitivity", "gpu_cap_sensitivity", gpu_cap, gpu_why)
    if not s.sources:
        trail.note("hints only (no metrics available)" if s.hints.any() else "no metrics available yet")
    else:
        trail.note(f"window {s.window_s:.0f} s of {s.window_goal_s:.0f} s")
    if s.missing:
        trail.note("without " + ", ".join(f"{source} ({why})" for source, why in sorted(s.missing.items())))
    return Classification(
        workload=s.workload, criticality=criticality, cpu_intensity=intensity, cpu_bound=bound,
        cpu_avg_utilization_pct=round(util, 1) if util is not None else None, cpu_cap_sensitivity=cap,
        gpu_intensity=gpu_intensity, gpu_bound=gpu_bound,
        gpu_avg_utilization_pct=round(gpu_util, 1) if gpu_util is not None else None,
        gpu_cap_sensitivity=gpu_sensitivity, reason="; ".join(trail.clauses), confidence=confidence_of(s),
        window_s=round(s.window_s, 1), signals=_signal_list(s))


def traits_of(classification: Classification) -> Dict[str, str]:
    """The classification as a profile's [traits] table (temper-profile(5) keys)."""
    c = classification
    return {"criticality": c.criticality, "cpu_intensity": c.cpu_intensity, "cpu_bound": c.cpu_bound,
            "cpu_cap_sensitivity": c.cpu_cap_sensitivity, "gpu_intensity": c.gpu_intensity,
            "gpu_bound": c.gpu_bound, "gpu_cap_sensitivity": c.gpu_cap_sensitivity}
