"""What kind of workload is this: a pure function from measured signals (and hints) to a
classification in the workload-profile vocabulary (criticality, cpu.intensity / bound /
avgUtilizationPct / capSensitivity, gpu.*), with an audit trail naming every threshold that fired
and a confidence that says how much the host could measure.

Nothing is read here: observe/workload_window.py gathers WorkloadSignals over the [classify]
window from the sources (schedstat, /proc/PID/io, task states, delay accounting, cgroup and host
PSI, memory.current against its limit, perf events, RAPL, NVML); a trained profile's [traits]
come from the same function. A class comes from the workload's own signals: a signal measured
over more than the workload (the host's PSI, a cgroup it shares) is named as context only.

Thresholds: intensity high >= 75 %, medium >= 30 % and compute when utilisation > 65 % (as the
Joulie classifier); unlike it, io and memory are measured (pressure stall information, sleeps in D
state, faults, hardware counters) rather than inferred from low CPU.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Dict, List, Mapping, Optional, Tuple

from temperd.config.daemon_config import CONFIG_SPEC
from temperd.config.profile import Traits

# ---- signal names (WorkloadSignals.measured keys) ---------------------------------------------
CPU_DEMAND = "cpu.demand_cpus"  # the CPUs its threads wanted: on-CPU time over the time not kept waiting
CPU_USED = "cpu.used_cpus"  # on-CPU only
CPU_CAPACITY = "cpu.capacity_cpus"  # what avgUtilizationPct is a share of
HOT_THREADS = "cpu.hot_threads"  # threads whose average demand is >= HOT_THREAD_CPUS, mostly not stalled
BUSIEST_THREAD = "cpu.busiest_thread_cpus"
# Pressure of the workload's own cgroup (cgroup v2 PSI; one no other process shares)
PSI_CPU = "psi.cgroup.cpu_some_pct"
PSI_MEMORY = "psi.cgroup.memory_some_pct"
PSI_MEMORY_FULL = "psi.cgroup.memory_full_pct"
PSI_IO = "psi.cgroup.io_some_pct"
PSI_IO_FULL = "psi.cgroup.io_full_pct"
HOST_PSI_CPU = "psi.host.cpu_some_pct"
HOST_PSI_MEMORY = "psi.host.memory_some_pct"
HOST_PSI_IO = "psi.host.io_some_pct"
# A cgroup the workload shares with other processes (the root cgroup, a login session's): context.
SHARED_PSI_CPU = "psi.shared_cgroup.cpu_some_pct"
SHARED_PSI_MEMORY = "psi.shared_cgroup.memory_some_pct"
SHARED_PSI_IO = "psi.shared_cgroup.io_some_pct"
D_STATE_SHARE = "sched.d_state_sleep_share"  # sampled sleeps that were uninterruptible (D)
IO_BYTES = "io.bytes_per_s"  # /proc/PID/io read_bytes + write_bytes
MAJOR_FAULTS = "mem.major_faults_per_s"
MEMORY_USE = "mem.use_of_limit"  # memory.current / (memory.high or memory.max)
BLKIO_DELAY = "delayacct.blkio_pct"  # block I/O delay, % of wall (delay accounting)
IPC = "perf.ipc"
LLC_MISSES = "perf.llc_misses_per_kinstr"
RAPL_DRAM_RATIO = "rapl.dram_energy_ratio"
GPU_UTIL = "gpu.util_pct"  # its processes' share of the GPU's time (NVML per-process samples)
GPU_MEMORY_UTIL = "gpu.memory_util_pct"  # its processes' share of the GPU memory's busy time (bandwidth)
# Its processes that hold no GPU and work for the ones that do (a trainer's DataLoader workers)
INPUT_WORKERS = "gpu.input_workers"  # how many want >= INPUT_WORKER_ACTIVE_CPUS
INPUT_WORKER_CPUS = "gpu.input_worker_cpus"  # the CPUs they want together
HOST_CPUS = "cpu.host_cpus"  # the CPUs the host (or its cgroup's cpuset) has: no recommendation exceeds it

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
OWN_IO_BYTES_PER_S = 64 * 1024  # less storage I/O of its own than this: its io pressure is not its storage's
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
INPUT_WORKER_ACTIVE_CPUS = 0.1  # a process below this is not one of the input workers
INPUT_BOUND_GPU_PCT = 50.0  # a GPU busy less than this while its workers are CPU-bound waits for input
INPUT_WORKER_BOUND_CPUS = 0.8  # wanted CPUs per worker, on average, that make the workers CPU-bound
INPUT_TARGET_GPU_PCT = 90.0  # how busy the GPU should be once its input keeps up


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
    tier: str = CONFIG_SPEC.default_of("default_tier")  # the tier of a workload no binding names
    measured: Mapping[str, float] = field(default_factory=dict)
    sources: Tuple[str, ...] = ()
    missing: Mapping[str, str] = field(default_factory=dict)
    hints: Hints = Hints()
    gpu_present: bool = False  # an NVIDIA GPU and NVML were found on the host
    psi_scope: str = ""  # the cgroup its pressure was read from, and whether it is its own

    def get(self, name: str) -> Optional[float]:
        return self.measured.get(name)


@dataclass(frozen=True)
class InputBound:
    """A GPU that waits for its input: its workers' CPUs and how many more they need."""

    gpu_util_pct: float
    workers: int
    worker_cpus: float  # what they want now, together
    more_cpus: int  # for the GPU to be busy INPUT_TARGET_GPU_PCT, within the host
    unbounded_more_cpus: int  # the same by the GPU's idle share alone, beyond the host where it is
    text: str  # "input-bound: its DataLoader workers need N more CPUs"

    def as_json(self) -> Dict[str, object]:
        return asdict(self)


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
    profile: Optional[str] = None  # the profile it matched, named beside its label
    gpu_memory_util_pct: Optional[float] = None
    input_bound: Optional["InputBound"] = None  # its GPU waits for its input workers

    def as_json(self) -> Dict[str, object]:
        """The workload-profile status shape."""
        return {
            "workload": self.workload,
            "profile": self.profile,
            "criticality": {"class": self.criticality},
            "cpu": {"intensity": self.cpu_intensity, "bound": self.cpu_bound,
                    "avgUtilizationPct": self.cpu_avg_utilization_pct, "capSensitivity": self.cpu_cap_sensitivity},
            "gpu": {"intensity": self.gpu_intensity, "bound": self.gpu_bound,
                    "avgUtilizationPct": self.gpu_avg_utilization_pct,
                    "memoryUtilizationPct": self.gpu_memory_util_pct, "capSensitivity": self.gpu_cap_sensitivity,
                    "inputBound": self.input_bound.as_json() if self.input_bound is not None else None},
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

    def decide(self, name: str, measured: str, why: str) -> str:
        """The hint of [traits] `name` if given (marked "(hint)", the measured value beside it),
        else the measured one."""
        key = name.replace("_", "-")  # cpu-intensity for cpu_intensity
        hinted = self.hints.get(name)
        if hinted is not None:
            found = "the same" if hinted == measured else measured
            self.clauses.append(f"{key}={hinted} (hint: {self.hints.source}; measured {found}: {why})")
            return hinted
        self.clauses.append(f"{key}={measured} ({why})")
        return measured


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


def _paging(s: WorkloadSignals) -> Optional[str]:
    """Why the workload's I/O is its own page-ins (None where it is not): at its memory limit with
    major faults, or faulting while its own memory stalls at least as much as its io. Its page-ins
    then raise io pressure, D-state sleeps and read bytes that are memory's doing, not storage's."""
    faults, use, memory_psi, io_psi = s.get(MAJOR_FAULTS), s.get(MEMORY_USE), s.get(PSI_MEMORY), s.get(PSI_IO)
    if (faults or 0.0) < MAJOR_FAULTS_PER_S:
        return None
    if use is not None and use >= MEMORY_USE_TIGHT:
        return f"at {use:.0%} of its memory limit with {faults:.0f} major faults/s (paging)"
    if (memory_psi or 0.0) >= max(io_psi or 0.0, PRESSURE_PCT):
        return (f"its own io pressure {_pct(io_psi or 0.0)} no larger than its memory pressure "
                f"{_pct(memory_psi or 0.0)}, with {faults:.0f} major faults/s (paging)")
    return None


def _context(s: WorkloadSignals) -> List[str]:
    """Pressure measured over more than the workload (the host; a cgroup it shares): named in the
    reason with its scope, never a cause of its class."""
    out = []
    for name, scope in ((SHARED_PSI_CPU, "cpu"), (SHARED_PSI_MEMORY, "memory"), (SHARED_PSI_IO, "io")):
        value = s.get(name)
        if value is not None and value >= PRESSURE_PCT:
            out.append(f"{scope} pressure {_pct(value)} in {s.psi_scope or 'a cgroup it shares'}")
    for name, scope in ((HOST_PSI_CPU, "cpu"), (HOST_PSI_MEMORY, "memory"), (HOST_PSI_IO, "io")):
        value = s.get(name)
        if value is not None and value >= PRESSURE_PCT:
            out.append(f"host {scope} pressure {_pct(value)}")
    return out


def _bound_evidence(s: WorkloadSignals, util: Optional[float]) -> Dict[str, List[str]]:
    """Each resource that constrains the workload and its own measurements that say so (its
    threads, its processes' I/O and faults, its own cgroup's pressure: PSI_* are read only from a
    cgroup no other workload shares). Pressure of the host or of a shared cgroup is context."""
    found: Dict[str, List[str]] = {"compute": [], "memory": [], "io": []}
    hot, busiest = s.get(HOT_THREADS), s.get(BUSIEST_THREAD)
    memory_psi, io_psi = s.get(PSI_MEMORY), s.get(PSI_IO)
    stalled = max(memory_psi or 0.0, io_psi or 0.0) >= PRESSURE_PCT
    if util is not None and util > COMPUTE_UTIL_PCT and not stalled:  # CPU spent while stalling is not compute
        found["compute"].append(f"util {_pct(util)} > {COMPUTE_UTIL_PCT:.0f}%")
    if hot and busiest is not None:
        found["compute"].append(f"{hot:.0f} hot thread(s), busiest {busiest:.2f} CPU >= {HOT_THREAD_CPUS}")
    if memory_psi is not None and memory_psi >= PRESSURE_PCT:
        found["memory"].append(f"own cgroup's memory pressure {_pct(memory_psi)} >= {PRESSURE_PCT:.0f}% of the window")
    faults = s.get(MAJOR_FAULTS)
    if faults is not None and faults >= MAJOR_FAULTS_PER_S:
        found["memory"].append(f"paging: its major faults {faults:.0f}/s >= {MAJOR_FAULTS_PER_S:.0f}/s")
    use = s.get(MEMORY_USE)
    if use is not None and use >= MEMORY_USE_TIGHT and (memory_psi or 0.0) >= MEMORY_USE_PRESSURE_PCT:
        found["memory"].append(f"memory at {use:.0%} of its limit >= {MEMORY_USE_TIGHT:.0%} with its own pressure "
                               f"{_pct(memory_psi or 0.0)}")
    ipc, llc = s.get(IPC), s.get(LLC_MISSES)
    if ipc is not None and llc is not None and ipc < LOW_IPC and llc >= HIGH_LLC_MISSES:
        found["memory"].append(f"IPC {ipc:.2f} < {LOW_IPC} with {llc:.0f} LLC misses/kinstr >= {HIGH_LLC_MISSES:.0f}")
    dram = s.get(RAPL_DRAM_RATIO)
    if dram is not None and dram > RAPL_DRAM_MEMORY:
        found["memory"].append(f"DRAM energy ratio {dram:.2f} > {RAPL_DRAM_MEMORY}")
    paging = _paging(s)
    d_share, io_bytes, blkio = s.get(D_STATE_SHARE), s.get(IO_BYTES), s.get(BLKIO_DELAY)
    own_io = io_bytes is not None and io_bytes >= OWN_IO_BYTES_PER_S
    io_signs = []  # what says it waits on storage; io-bound only with I/O of its own to wait on
    if io_psi is not None and io_psi >= PRESSURE_PCT:
        io_signs.append(f"own cgroup's io pressure {_pct(io_psi)} >= {PRESSURE_PCT:.0f}% of the window")
    if d_share is not None and d_share >= D_STATE_IO_SHARE:
        io_signs.append(f"{d_share:.0%} of its sampled sleeps in D state >= {D_STATE_IO_SHARE:.0%}")
    if blkio is not None and blkio >= BLKIO_DELAY_PCT:
        io_signs.append(f"its block I/O delay {_pct(blkio)} >= {BLKIO_DELAY_PCT:.0f}%")
    if io_signs and paging:
        # Its I/O is its own page-ins: memory's doing, whatever io pressure they raise.
        found["memory"].append(paging)
        found["memory"].extend(f"{sign} (paging)" for sign in io_signs)
    elif io_signs and own_io:
        found["io"].extend(io_signs)
        found["io"].append(f"its processes' storage I/O {_bytes(io_bytes or 0.0)}/s")
    elif d_share is not None and d_share >= D_STATE_IO_SHARE:  # its own D-state sleeps, not page-ins
        found["io"].append(f"{d_share:.0%} of its sampled sleeps in D state >= {D_STATE_IO_SHARE:.0%}, "
                           f"not page-ins ({faults or 0.0:.0f} major faults/s)")
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


def input_bound(s: WorkloadSignals) -> Optional[InputBound]:
    """Its GPU mostly idle while the processes that feed it (holding no GPU) each want nearly a
    whole CPU: the GPU waits for input. More CPUs for the workers raise the GPU's busy share about
    in proportion, so they need worker_cpus x (target / util) in all, within the host's CPUs."""
    util, workers, cpus = s.get(GPU_UTIL), s.get(INPUT_WORKERS), s.get(INPUT_WORKER_CPUS)
    if util is None or not workers or cpus is None or util >= INPUT_BOUND_GPU_PCT:
        return None
    if cpus / workers < INPUT_WORKER_BOUND_CPUS:
        return None
    wanted = cpus * INPUT_TARGET_GPU_PCT / max(util, 1.0)
    unbounded = max(1, math.ceil(wanted - cpus - 1e-9))
    host = s.get(HOST_CPUS)
    more = unbounded if host is None else max(0, min(unbounded, math.floor(host - cpus + 1e-9)))
    text = (f"input-bound: its DataLoader workers need {more} more CPUs" if more else
            "input-bound: its DataLoader workers need more CPUs than this host has")
    why = (f"GPU busy {_pct(util)} < {INPUT_BOUND_GPU_PCT:.0f}% while its {workers:.0f} input worker(s) want "
           f"{cpus / workers:.2f} CPU each >= {INPUT_WORKER_BOUND_CPUS}; busy {INPUT_TARGET_GPU_PCT:.0f}% takes "
           f"about {cpus:.1f} x {INPUT_TARGET_GPU_PCT:.0f}/{util:.0f} = {wanted:.1f} CPUs")
    if host is not None and unbounded > more:
        why += f", {unbounded} more by the GPU's idle share alone, beyond this host's {host:.0f} CPUs"
    return InputBound(round(util, 1), int(workers), round(cpus, 2), more, unbounded, f"{text} ({why})")


def _gpu(s: WorkloadSignals) -> Tuple[str, str, Optional[float], str, str, str]:
    """(intensity, bound, util, cap sensitivity, why, why the bound)."""
    util = s.get(GPU_UTIL)
    if util is None:
        why = "no NVIDIA GPU or NVML on this host" if not s.gpu_present else "no GPU use by its processes"
        return "none", "none", None, "none", why, why
    memory = s.get(GPU_MEMORY_UTIL)
    level = "high" if util >= GPU_HIGH_PCT else "medium" if util >= GPU_MEDIUM_PCT else "low"
    starving = input_bound(s)
    if starving is not None:
        bound = "input"
    else:
        bound = "memory" if memory is not None and memory >= GPU_MEMORY_BOUND_PCT and memory > util else "compute"
    sensitivity = "high" if level == "high" and bound == "compute" else "medium" if level != "low" else "low"
    why = f"its processes' GPU util {_pct(util)}" + (f", memory-bandwidth use {_pct(memory)}" if memory is not None else "")
    return level, bound, util, sensitivity, why, starving.text if starving is not None else why


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


def classify(signals: WorkloadSignals, profile: Optional[str] = None) -> Classification:
    """Classify one workload from what was measured of it.

    criticality: performance for the critical tier, else standard; cpu.intensity from the
    utilisation (demand / capacity); cpu.bound: every resource whose threshold fired (compute:
    utilisation or a hot thread; memory: memory pressure, major faults, use at the limit under
    pressure, low IPC with cache misses, DRAM energy; io: io pressure, D-state sleeps with I/O,
    block I/O delay), "mixed" where more than one fired or none did; capSensitivity from the
    bound, utilisation and hot threads; gpu.* from NVML (its processes' shares of the GPU's
    time and memory bandwidth), "none" without a GPU, gpu-bound "input" where the GPU waits for
    CPU-bound input workers (input_bound). Hints (profile
    [traits], a binding's traits) override each field they name, marked "(hint)" in the reason.
    The reason names every threshold that fired with its measured value, the window, and the
    sources that were missing; the confidence is lower for a short window or missing sources."""
    s = signals
    trail = _Trail(s.hints)
    util = utilization_pct(s)
    hot = s.get(HOT_THREADS) or 0.0

    tier_class = "performance" if s.tier == "critical" else "standard"
    criticality = trail.decide("criticality", tier_class, f"tier {s.tier}")
    intensity = trail.decide("cpu_intensity", *_intensity(util))
    bound = trail.decide("cpu_bound", *_bound(_bound_evidence(s, util), util))
    cap = trail.decide("cpu_cap_sensitivity", *_cap_sensitivity(bound, util, hot))
    gpu_level, gpu_bound_measured, gpu_util, gpu_cap, gpu_why, gpu_bound_why = _gpu(s)
    gpu_hinted = any(s.hints.get(name) is not None for name in _HINT_FIELDS if name.startswith("gpu"))
    if gpu_util is None and not gpu_hinted:
        trail.clauses.append(f"gpu=none ({gpu_why})")
        gpu_intensity = gpu_bound = gpu_sensitivity = "none"
    else:
        gpu_intensity = trail.decide("gpu_intensity", gpu_level, gpu_why)
        gpu_bound = trail.decide("gpu_bound", gpu_bound_measured, gpu_bound_why)
        gpu_sensitivity = trail.decide("gpu_cap_sensitivity", gpu_cap, gpu_why)
    context = _context(s)
    if context:
        trail.clauses.append("context, not its own and no cause of its class: " + ", ".join(context))
    if not s.sources:
        trail.clauses.append("hints only (no metrics available)" if s.hints.any() else "no metrics available yet")
    else:
        trail.clauses.append(f"window {s.window_s:.0f} s of {s.window_goal_s:.0f} s")
    if s.missing:
        trail.clauses.append("without " + ", ".join(f"{source} ({why})" for source, why in sorted(s.missing.items())))
    return Classification(
        workload=s.workload, criticality=criticality, cpu_intensity=intensity, cpu_bound=bound,
        cpu_avg_utilization_pct=round(util, 1) if util is not None else None, cpu_cap_sensitivity=cap,
        gpu_intensity=gpu_intensity, gpu_bound=gpu_bound,
        gpu_avg_utilization_pct=round(gpu_util, 1) if gpu_util is not None else None,
        gpu_cap_sensitivity=gpu_sensitivity, reason="; ".join(trail.clauses), confidence=confidence_of(s),
        window_s=round(s.window_s, 1), signals=_signal_list(s), profile=profile,
        gpu_memory_util_pct=round(s.get(GPU_MEMORY_UTIL), 1) if s.get(GPU_MEMORY_UTIL) is not None else None,
        input_bound=input_bound(s))


def traits_of(classification: Classification) -> Dict[str, str]:
    """The classification as a profile's [traits] table (temper-profile(5) keys)."""
    return {name: getattr(classification, name) for name in _HINT_FIELDS}
