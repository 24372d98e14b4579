"""Scheduling delay per layer: how long a member thread waits on a runqueue before it runs.

Two sources, one shape of result (`LatencyReport`):

- bpf: the bcc program `bpf/runqlat.bpf.c`, loaded through the distribution's python3-bpfcc.
  The plan's tid -> layer map is written into the kernel (`update_membership`); a thread that
  is not a member costs one hash lookup per wakeup or switch. Per layer: a log2 histogram of
  wakeup -> run delay (microsecond slots), its sum, its maximum, and off-CPU reasons (preempted,
  voluntary sleep, D state).
- schedstat: where bcc or the kernel headers it compiles against are missing. The observer
  already reads each member's /proc/PID/task/TID/schedstat every sample (run ns, runqueue wait
  ns, timeslices run); `add_schedstat` turns one thread's window into `slices` observations of
  its mean wait. Count and sum are exact; the buckets hold per-thread window means, so the
  tail is under-stated (a mean never shows the one slow wakeup) - /observe and /metrics say
  which source filled them.

This module reads the kernel only; it never imports observe, daemon or backends.
"""

from __future__ import annotations

import ctypes
import dataclasses
import importlib.util
import logging
import os
import re
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Tuple

from temperd.plan import LayerPlan
from temperd.sources import procfs

log = logging.getLogger("temperd.telemetry")

BPF = "bpf"
SCHEDSTAT = "schedstat"

# Slot k holds delays d (whole microseconds) with bit_length(d) == k, i.e. d < 2**k us: bcc's
# bpf_log2l. Slots above EXPOSED_SLOTS are counted in +Inf only.
SLOTS = 26
EXPOSED_SLOTS = 23  # le = 1 us .. 2**22 us (4.2 s)
BOUNDS_S: Tuple[float, ...] = tuple((2 ** k) / 1e6 for k in range(EXPOSED_SLOTS))
MAX_LAYERS = 256
MAX_MEMBERS = 16384
OFFCPU_REASONS = ("preempted", "voluntary", "uninterruptible")

SOURCE_DIRS = (os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "bpf"),
               "/usr/share/temperd/bpf")
PROGRAM = "runqlat.bpf.c"

_PID_PART = re.compile(r"-?pid\d+")


def metric_layer_name(name: str) -> str:
    """A layer's name for a metric label: no pid in it (a workload without a unit is keyed
    "<profile>:pid<N>", its layers "<profile>-pid<N>.<group>"), so labels stay bounded across
    restarts of the workload: "memcached.workers"."""
    return _PID_PART.sub("", name).strip("-.") or name


def slot_of(delay_us: float) -> int:
    return min(int(delay_us).bit_length() if delay_us >= 1 else 0, SLOTS - 1)


@dataclass
class LayerLatency:
    """One layer's scheduling delay: cumulative since temperd started (for /metrics) and over the
    last window (for /observe and the linter)."""

    layer: str  # the plan's layer name
    source: str
    slots: List[int] = field(default_factory=lambda: [0] * SLOTS)  # cumulative, per slot (not cumulative over le)
    count: int = 0
    sum_s: float = 0.0
    offcpu: Dict[str, int] = field(default_factory=dict)  # cumulative, bpf only
    window_count: int = 0
    p50_s: Optional[float] = None
    p99_s: Optional[float] = None
    max_s: Optional[float] = None

    def snapshot(self) -> "LayerLatency":
        """A copy the next window leaves alone (the source keeps updating its own)."""
        return dataclasses.replace(self, slots=list(self.slots), offcpu=dict(self.offcpu))

    def buckets(self) -> List[Tuple[float, int]]:
        """(le, cumulative count) for the exposed bounds; +Inf is `count`."""
        out, running = [], 0
        for k, bound in enumerate(BOUNDS_S):
            running += self.slots[k]
            out.append((bound, running))
        return out

    def as_json(self) -> dict:
        return {"layer": self.layer, "source": self.source, "count": self.count, "sum_s": round(self.sum_s, 6),
                "window_count": self.window_count,
                "p50_s": _round(self.p50_s), "p99_s": _round(self.p99_s), "max_s": _round(self.max_s),
                **({"offcpu": dict(self.offcpu)} if self.offcpu else {})}


def _round(value: Optional[float]) -> Optional[float]:
    return None if value is None else round(value, 7)


@dataclass(frozen=True)
class LatencyReport:
    source: str  # BPF or SCHEDSTAT
    reason: Optional[str]  # why not bpf; None when bpf runs
    layers: Tuple[LayerLatency, ...] = ()

    def layer(self, name: str) -> Optional[LayerLatency]:
        for item in self.layers:
            if item.layer == name:
                return item
        return None

    def describe(self) -> str:
        """`temperctl status`'s telemetry line: "bpf" or "schedstat (bcc: no headers for 6.1...)"."""
        return self.source if self.reason is None else f"{self.source} ({self.reason})"

    def as_json(self) -> dict:
        return {"source": self.source, "reason": self.reason, "layers": [l.as_json() for l in self.layers]}


def weighted_quantile(values: Iterable[Tuple[float, int]], q: float) -> Optional[float]:
    """The q-quantile of values each seen `weight` times."""
    items = sorted((v, w) for v, w in values if w > 0)
    total = sum(w for _, w in items)
    if not total:
        return None
    rank = q * total
    running = 0
    for value, weight in items:
        running += weight
        if running >= rank:
            return value
    return items[-1][0]


def bucket_quantile(slots: List[int], q: float) -> Optional[float]:
    """The q-quantile of a window's slot counts, interpolated inside the slot as Prometheus'
    histogram_quantile does (slot k spans [2**(k-1), 2**k) us)."""
    total = sum(slots)
    if not total:
        return None
    rank = q * total
    running = 0
    for k, n in enumerate(slots):
        if n and running + n >= rank:
            low = (2 ** (k - 1)) if k else 0
            high = 2 ** k
            return (low + (high - low) * (rank - running) / n) / 1e6
        running += n
    return (2 ** (SLOTS - 1)) / 1e6


# ---- where bcc cannot run ------------------------------------------------------------------------

# Loading a tracepoint program needs CAP_BPF and CAP_PERFMON (Linux >= 5.8; before, CAP_SYS_ADMIN,
# which also covers both on newer kernels). Attaching it (perf_event_open) needs CAP_SYS_ADMIN too
# where kernel.perf_event_paranoid is above 2: Debian's and Ubuntu's kernels add that level and
# default to it. temperd.service leaves all three out.
BCC_CAPABILITIES = (("CAP_PERFMON", 38), ("CAP_BPF", 39))
CAP_SYS_ADMIN = 21
PERF_PARANOID = "/proc/sys/kernel/perf_event_paranoid"
DROPIN_HINT = "under systemd, the bpf-telemetry.conf drop-in grants what bcc needs: see temperd(8)"


def bcc_unavailable(release: Optional[str] = None, modules_root: str = "/lib/modules",
                    sys_kernel: str = "/sys/kernel", status_path: str = "/proc/self/status",
                    paranoid_path: str = PERF_PARANOID) -> Optional[str]:
    """Why the bcc program cannot be loaded here, or None. Checked before bcc is asked, so that
    libbcc never prints its own complaint to temperd's stderr."""
    release = release or os.uname().release
    try:  # found, not imported: importing bcc loads libbcc, which BpfLatency does where it is used
        found = importlib.util.find_spec("bcc") is not None  # python3-bpfcc, never PyPI's bcc
    except (ImportError, ValueError):
        found = False
    if not found:
        return "bcc: python3-bpfcc not installed"
    missing = procfs.missing_capabilities(BCC_CAPABILITIES, status_path, covered_by=CAP_SYS_ADMIN)
    if missing:
        return f"bcc: temperd lacks {', '.join(missing)} ({DROPIN_HINT})"
    paranoid = (procfs.read_bytes(paranoid_path, 64) or b"").strip()
    if paranoid.lstrip(b"-").isdigit() and int(paranoid) > 2 and \
            procfs.missing_capabilities((("CAP_SYS_ADMIN", CAP_SYS_ADMIN),), status_path):
        return (f"bcc: kernel.perf_event_paranoid is {int(paranoid)}, where attaching to tracepoints needs "
                f"CAP_SYS_ADMIN, which temperd lacks ({DROPIN_HINT})")
    if os.environ.get("BCC_KERNEL_SOURCE"):
        return None
    for path in (os.path.join(modules_root, release, "build"), os.path.join(modules_root, release, "source"),
                 os.path.join(sys_kernel, "kheaders.tar.xz")):
        if os.path.exists(path):
            return None
    try:
        hidden = os.path.isdir(modules_root) and not os.listdir(modules_root)
    except OSError:
        hidden = True
    if hidden:  # systemd's ProtectKernelModules=yes shows an empty, inaccessible directory
        return f"bcc: {modules_root} is hidden from temperd ({DROPIN_HINT})"
    return f"bcc: no headers for {release}"


def _pid_max() -> int:
    try:
        with open("/proc/sys/kernel/pid_max") as handle:
            return int(handle.read())
    except (OSError, ValueError):
        return 4194304


def program_path() -> Optional[str]:
    for directory in SOURCE_DIRS:
        path = os.path.join(directory, PROGRAM)
        if os.path.isfile(path):
            return path
    return None


# ---- the two sources ---------------------------------------------------------------------------


class _Accumulator:
    """Cumulative per-layer latency, keyed by plan layer name."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.layers: Dict[str, LayerLatency] = {}

    def get(self, name: str) -> LayerLatency:
        item = self.layers.get(name)
        if item is None:
            item = self.layers[name] = LayerLatency(name, self.source)
        return item

    def keep_only(self, names: Iterable[str]) -> None:
        wanted = set(names)
        for name in [n for n in self.layers if n not in wanted]:
            del self.layers[name]


class SchedstatLatency:
    """The fallback: fed by the observer's schedstat reads of each member (no reads of its own)."""

    source = SCHEDSTAT

    def __init__(self) -> None:
        self._acc = _Accumulator(SCHEDSTAT)
        self._seen: Dict[Tuple[int, int], Tuple[int, int]] = {}  # (pid, tid) -> (wait ns, slices)
        self._window: Dict[str, List[Tuple[float, int]]] = {}
        self._now: Dict[Tuple[int, int], Tuple[int, int]] = {}

    def add_schedstat(self, layer: str, pid: int, tid: int, wait_ns: int, slices: int) -> None:
        key = (pid, tid)
        self._now[key] = (wait_ns, slices)
        before = self._seen.get(key)
        if before is None:
            return  # first sight: the totals since the thread started are not this window's
        d_wait, d_slices = wait_ns - before[0], slices - before[1]
        if d_slices <= 0 or d_wait < 0:
            return
        mean_s = d_wait / d_slices / 1e9
        item = self._acc.get(layer)
        item.slots[slot_of(mean_s * 1e6)] += d_slices
        item.count += d_slices
        item.sum_s += d_wait / 1e9
        self._window.setdefault(layer, []).append((mean_s, d_slices))

    def end_window(self, layer_names: Iterable[str]) -> Tuple[LayerLatency, ...]:
        names = list(layer_names)
        self._acc.keep_only(names)
        self._seen, self._now = self._now, {}
        out = []
        for name in names:
            item = self._acc.get(name)
            window = self._window.get(name, [])
            item.window_count = sum(w for _, w in window)
            item.p50_s = weighted_quantile(window, 0.50)
            item.p99_s = weighted_quantile(window, 0.99)
            item.max_s = max((v for v, _ in window), default=None)
            out.append(item.snapshot())
        self._window = {}
        return tuple(out)

    def update_membership(self, plan: LayerPlan) -> None:
        pass  # the observer reads the plan's members itself

    def close(self) -> None:
        pass


class BpfLatency:
    """bpf/runqlat.bpf.c through bcc. Raises at construction where it cannot load."""

    source = BPF

    def __init__(self, path: str) -> None:
        from bcc import BPF as Bcc  # python3-bpfcc

        self._words = (_pid_max() + 63) // 64
        self._bpf = Bcc(src_file=path.encode(), cflags=[f"-DMAX_MEMBERS={MAX_MEMBERS}", f"-DMAX_LAYERS={MAX_LAYERS}",
                                                       f"-DSLOTS={SLOTS}", f"-DBITMAP_WORDS={self._words}"])
        self._layer_of = self._bpf["layer_of"]
        self._bits = self._bpf["member_bits"]
        self._hist = self._bpf["hist"]
        self._sum = self._bpf["sum_ns"]
        self._max = self._bpf["max_ns"]
        self._offcpu = self._bpf["offcpu"]
        self._acc = _Accumulator(BPF)
        self._ids: Dict[str, int] = {}  # layer name -> id (1..MAX_LAYERS-1)
        self._members: Dict[int, int] = {}  # tid -> id, as written into the kernel
        self._last_slots: Dict[Tuple[int, int], int] = {}
        self._last_sum: Dict[int, int] = {}
        self._last_off: Dict[Tuple[int, int], int] = {}
        self._plan: Optional[LayerPlan] = None

    def add_schedstat(self, layer: str, pid: int, tid: int, wait_ns: int, slices: int) -> None:
        pass

    def update_membership(self, plan: LayerPlan) -> None:
        """Write the plan's tid -> layer id map into the kernel: only what changed."""
        if plan is self._plan:
            return
        self._plan = plan
        names = {layer.name for layer in plan.layers}  # a set: a plan has thousands of layers under a fork storm
        for name in [n for n in self._ids if n not in names]:
            self._forget(self._ids.pop(name))
        free = sorted(set(range(1, MAX_LAYERS)) - set(self._ids.values()))
        wanted: Dict[int, int] = {}
        for layer in plan.layers:
            if layer.name not in self._ids:
                if not free:
                    continue
                self._ids[layer.name] = free.pop(0)
            for tid in layer.selector.tids:
                wanted[tid] = self._ids[layer.name]
        c = ctypes.c_uint32
        if len(wanted) > MAX_MEMBERS:  # keep the first MAX_MEMBERS by tid; the rest go unmeasured
            wanted = dict(sorted(wanted.items())[:MAX_MEMBERS])
        words: Dict[int, int] = {}
        for tid in set(wanted) | set(self._members):
            words.setdefault(tid >> 6, 0)
        for tid in wanted:
            words[tid >> 6] |= 1 << (tid & 63)
        # Bits first off, then layer ids, then bits on: the kernel never sees a member bit without its layer.
        old_words: Dict[int, int] = {}
        for tid in self._members:
            old_words[tid >> 6] = old_words.get(tid >> 6, 0) | (1 << (tid & 63))
        for word, bits in words.items():
            if word < self._words and bits != old_words.get(word, 0):
                self._bits[ctypes.c_int(word)] = ctypes.c_uint64(bits & old_words.get(word, 0))
        for tid in [t for t in self._members if t not in wanted]:
            try:
                del self._layer_of[c(tid)]
            except KeyError:
                pass
        for tid, lid in wanted.items():
            if self._members.get(tid) != lid:
                self._layer_of[c(tid)] = c(lid)
        for word, bits in words.items():
            if word < self._words and bits != old_words.get(word, 0):
                self._bits[ctypes.c_int(word)] = ctypes.c_uint64(bits)
        self._members = wanted

    def _forget(self, lid: int) -> None:
        """A layer left the plan: its id's counts go, so that a later layer starts from zero."""
        for key in list(self._hist.keys()):
            if key.layer == lid:
                del self._hist[key]
        self._sum[ctypes.c_int(lid)] = ctypes.c_uint64(0)
        self._max[ctypes.c_int(lid)] = ctypes.c_uint64(0)
        self._last_slots = {k: v for k, v in self._last_slots.items() if k[0] != lid}
        self._last_off = {k: v for k, v in self._last_off.items() if k[0] != lid}
        self._last_sum.pop(lid, None)

    def end_window(self, layer_names: Iterable[str]) -> Tuple[LayerLatency, ...]:
        names = list(layer_names)
        self._acc.keep_only(names)
        by_id = {lid: name for name, lid in self._ids.items()}
        window: Dict[int, List[int]] = {}
        for key, value in self._hist.items():
            lid, slot = key.layer, min(key.slot, SLOTS - 1)
            if lid not in by_id:
                continue
            total = value.value
            grown = total - self._last_slots.get((lid, slot), 0)
            self._last_slots[(lid, slot)] = total
            if grown > 0:
                item = self._acc.get(by_id[lid])
                item.slots[slot] += grown
                item.count += grown
                window.setdefault(lid, [0] * SLOTS)[slot] += grown
        for lid, name in by_id.items():
            total = self._sum[ctypes.c_int(lid)].value
            grown = total - self._last_sum.get(lid, 0)
            self._last_sum[lid] = total
            if grown > 0:
                self._acc.get(name).sum_s += grown / 1e9
        for key, value in self._offcpu.items():
            lid, reason = key.layer, key.reason
            if lid not in by_id or reason >= len(OFFCPU_REASONS):
                continue
            grown = value.value - self._last_off.get((lid, reason), 0)
            self._last_off[(lid, reason)] = value.value
            if grown > 0:
                item = self._acc.get(by_id[lid])
                item.offcpu[OFFCPU_REASONS[reason]] = item.offcpu.get(OFFCPU_REASONS[reason], 0) + grown
        out = []
        for name in names:
            item = self._acc.get(name)
            lid = self._ids.get(name)
            slots = window.get(lid, [0] * SLOTS) if lid is not None else [0] * SLOTS
            item.window_count = sum(slots)
            item.p50_s = bucket_quantile(slots, 0.50)
            item.p99_s = bucket_quantile(slots, 0.99)
            item.max_s = None
            if lid is not None:
                key = ctypes.c_int(lid)
                peak = self._max[key].value
                self._max[key] = ctypes.c_uint64(0)  # the maximum of the next window starts anew
                item.max_s = peak / 1e9 if item.window_count else None
            out.append(item.snapshot())
        return tuple(out)

    def close(self) -> None:
        self._bpf.cleanup()


# TEMPERD_BPF=0 in temperd's environment keeps the bcc program unloaded whatever temperd.toml says
# (measurements of its cost: bench/overhead.py --bpf off).
BPF_ENV = "TEMPERD_BPF"


class Telemetry:
    """The scheduling-delay source temperd uses: bpf where it loads, else schedstat; `reason`
    says why not bpf (logged once, at start, and again when a reload changes [telemetry] bpf)."""

    def __init__(self, want_bpf: bool = True) -> None:
        """want_bpf: [telemetry] bpf of temperd.toml."""
        self.want_bpf = want_bpf
        self.impl = None
        self.reason: Optional[str] = None
        self.report = LatencyReport(SCHEDSTAT, "not started")

    def set_bpf(self, want_bpf: bool) -> None:
        """A reload: [telemetry] bpf changed, so the source starts anew (the bcc program is
        unloaded, or loaded where it can be); the next applied plan fills its membership."""
        if want_bpf == self.want_bpf:
            return
        self.want_bpf = want_bpf
        if self.impl is not None:
            self.close()
            self.impl = None
            self.start()

    @property
    def source(self) -> str:
        return self.impl.source if self.impl is not None else SCHEDSTAT

    def start(self) -> None:
        if self.impl is not None:
            return
        if os.environ.get(BPF_ENV, "1") == "0":
            self.reason = f"bpf off: {BPF_ENV}=0"
        elif not self.want_bpf:
            self.reason = "bpf off: [telemetry] bpf = false"
        else:
            self.reason = bcc_unavailable()
        path = program_path() if self.reason is None else None
        if self.reason is None and path is None:
            self.reason = f"bcc: {PROGRAM} not found"
        if self.reason is None:
            try:
                self.impl = BpfLatency(path)
                log.info("telemetry: bpf (%s loaded with bcc): scheduling delay per layer from the kernel", PROGRAM)
            except Exception as exc:  # bcc raises plain Exception for a failed compile or attach
                self.reason = f"bcc: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
        if self.impl is None:
            self.impl = SchedstatLatency()
            log.info("telemetry: schedstat (%s): scheduling delay per layer as schedstat means", self.reason)
        self.report = LatencyReport(self.source, self.reason)

    def describe(self) -> str:
        return self.report.describe() if self.impl is not None else "not started"

    def update_membership(self, plan: LayerPlan) -> None:
        """The plan was applied: the kernel-side filter follows its members."""
        if self.impl is not None:
            self.impl.update_membership(plan)

    def add_schedstat(self, layer: str, pid: int, tid: int, wait_ns: int, slices: int) -> None:
        if self.impl is not None:
            self.impl.add_schedstat(layer, pid, tid, wait_ns, slices)

    def end_window(self, plan: LayerPlan) -> LatencyReport:
        if self.impl is None:
            self.start()
        assert self.impl is not None
        self.report = LatencyReport(self.source, self.reason, self.impl.end_window(l.name for l in plan.layers))
        return self.report

    def close(self) -> None:
        if self.impl is not None:
            self.impl.close()

