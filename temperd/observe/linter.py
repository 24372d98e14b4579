"""The placement linter: checks what the observer saw against what the plan promises.

- smt_collision: a protected (Confined) member shares a physical core with a busy non-member
  running on its SMT sibling (not under scx_layered with --allow-partial-core, where an owned
  layer's siblings are every layer's by design);
- protected_fallback: a protected member last ran outside its layer's CPUs (under scx_layered an
  owned layer is Grouped: its threads run on its CPUs first and may spill onto others while every
  CPU of its own is busy; only a member outside while one of its CPUs sat idle counts: no busy
  thread last ran there and /proc/stat has it idle half the window or more);
- open_reserve: a busy thread that is not a member ran on CPUs an exclusive layer fences (or on
  the idle siblings it keeps), eating into the reserve promised to that layer (owned CPUs may
  be borrowed while their owners sleep: not a violation);
- layer_mismatch: a member's treatment (affinity, policy, nice) differs from what its layer implies;
- runqueue_latency: a protected layer's (exclusive or latency treatment) scheduling-delay p99 over
  the window exceeds the bound of temperd.toml's [lint] runqueue_latency_p99_ms (the delay from
  the bcc program where it loads, else schedstat means: the Observation's LatencyReport).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass
from typing import Dict, FrozenSet, Iterable, List, Mapping, Optional, Tuple

from temperd.backends.native.sched import POLICY_BY_NAME
from temperd.backends.scx.kinds import is_owned, partial_cores
from temperd.control.status import LintView
from temperd.observe.observer import BUSY_RATIO, Observation
from temperd.plan import CONFINED, EXCLUSIVE, FENCED, LATENCY, LayerPlan

log = logging.getLogger("temperd.lint")

SMT_COLLISION = "smt_collision"
PROTECTED_FALLBACK = "protected_fallback"
OPEN_RESERVE = "open_reserve"
LAYER_MISMATCH = "layer_mismatch"
RUNQUEUE_LATENCY = "runqueue_latency"
INVARIANTS = (SMT_COLLISION, PROTECTED_FALLBACK, OPEN_RESERVE, LAYER_MISMATCH, RUNQUEUE_LATENCY)
# A window with fewer wakeups than this says too little about a tail to call it a violation.
LATENCY_MIN_WAKEUPS = 20
# A CPU idle for at least this share of the window had room for a member that ran elsewhere.
IDLE_CPU_RATIO = 0.5


@dataclass(frozen=True)
class Violation:
    invariant: str  # one of INVARIANTS
    layer: Optional[str]
    tid: int
    message: str


@dataclass(frozen=True)
class LintReport:
    """The violations of one observation sample: what `temperctl status`, /observe and /metrics show."""

    violations: Tuple[Violation, ...] = ()

    def summary(self) -> LintView:
        """The count of violations, and by invariant (only the invariants violated)."""
        counts = Counter(v.invariant for v in self.violations)
        return LintView(len(self.violations), {k: counts[k] for k in INVARIANTS if counts[k]})


def lint(plan: LayerPlan, observation: Observation, shape, match=None, *, check_treatment: bool = True,
         confined_cpus: Optional[Mapping[str, FrozenSet[int]]] = None,
         latency_bound_s: Optional[float] = None) -> List[Violation]:
    """check_treatment: the native backend sets affinity/policy/nice itself, so they can be read back;
    under scx_layered they are the kernel defaults and only placement is checked.

    confined_cpus: the CPUs each Confined layer really owns, by layer name. None: the plan's CPU
    numbers (the native backend pins exactly those). scx_layered picks a layer's cores itself, so
    under it this comes from its stats; a layer missing from it is not checked for placement."""
    out: List[Violation] = []
    layers = {layer.name: layer for layer in plan.layers}
    cpus_of: Dict[str, FrozenSet[int]] = {}
    fenced: Dict[int, str] = {}
    for layer in plan.layers:
        if layer.kind != CONFINED:
            continue
        if confined_cpus is None:
            cpus_of[layer.name] = frozenset(layer.cpus)
            kept = tuple(layer.cpus) + tuple(layer.idle_siblings)
        elif layer.name in confined_cpus:
            cpus_of[layer.name] = frozenset(confined_cpus[layer.name])
            kept = tuple(c for cpu in cpus_of[layer.name] for c in (cpu,) + _siblings(shape, cpu))  # whole cores
        else:
            continue
        if layer.ownership == FENCED:  # owned CPUs may be borrowed while their owners sleep
            for cpu in kept:
                fenced[cpu] = layer.name
    under_scx = confined_cpus is not None
    shared_siblings = under_scx and partial_cores(plan.layers)
    # A CPU ran busy where a busy thread last ran on it, or where it sat idle less than half the
    # window: the threads read are the plan's and the busiest others', not every thread there.
    busy_cpus = frozenset(t.cpu for t in observation.threads if t.util >= BUSY_RATIO) | frozenset(
        cpu for cpu, idle in observation.cpu_idle.items() if idle < IDLE_CPU_RATIO)
    for t in observation.threads:
        layer = layers.get(t.layer) if t.layer else None
        busy = t.util >= BUSY_RATIO
        if layer is not None and layer.kind == CONFINED:
            mine = cpus_of.get(layer.name)
            spills = under_scx and is_owned(layer)
            outside = busy and mine is not None and t.cpu not in mine
            if outside and not (spills and mine <= busy_cpus):
                out.append(Violation(PROTECTED_FALLBACK, layer.name, t.tid,
                                     f"{t.comm} ({t.tid}) of {layer.name} ran on CPU {t.cpu}, outside its CPUs {sorted(mine)}"
                                     + (f" while CPU(s) {sorted(mine - busy_cpus)} of its own sat idle" if spills else "")))
            if busy and t.sibling_busy and not outside and not (shared_siblings and is_owned(layer)):
                sibling_threads = [o for o in observation.threads if o.layer != layer.name and o.util >= BUSY_RATIO
                                   and o.cpu in shape.siblings(t.cpu)]
                if sibling_threads:
                    other = sibling_threads[0]
                    out.append(Violation(SMT_COLLISION, layer.name, t.tid,
                                         f"{t.comm} ({t.tid}) of {layer.name} on CPU {t.cpu} shares core {t.core} with busy "
                                         f"{other.comm} ({other.tid}) on CPU {other.cpu}"))
        if busy and t.cpu in fenced and t.layer != fenced[t.cpu]:
            out.append(Violation(OPEN_RESERVE, fenced[t.cpu], t.tid,
                                 f"{t.comm} ({t.tid}) is not in {fenced[t.cpu]} but ran on its fenced CPU {t.cpu}"))
        if check_treatment and layer is not None:
            problem = _treatment_mismatch(layer, t)
            if problem:
                out.append(Violation(LAYER_MISMATCH, layer.name, t.tid, f"{t.comm} ({t.tid}) of {layer.name}: {problem}"))
    if latency_bound_s is not None:
        out.extend(_latency_violations(plan, observation, latency_bound_s))
    return out


def _latency_violations(plan: LayerPlan, observation: Observation, bound_s: float) -> List[Violation]:
    """One violation per protected layer whose window p99 exceeds the bound (tid 0: the layer's)."""
    report = observation.latency
    if report is None:
        return []
    out = []
    for layer in plan.layers:
        if layer.treatment not in (EXCLUSIVE, LATENCY):
            continue
        seen = report.layer(layer.name)
        if seen is None or seen.p99_s is None or seen.window_count < LATENCY_MIN_WAKEUPS:
            continue
        if seen.p99_s > bound_s:
            out.append(Violation(RUNQUEUE_LATENCY, layer.name, 0,
                                 f"{layer.name}: scheduling delay p99 {seen.p99_s * 1e3:.3f} ms over "
                                 f"{seen.window_count} wakeups ({report.source}) exceeds the bound "
                                 f"{bound_s * 1e3:g} ms"))
    return out


def _siblings(shape, cpu: int) -> Tuple[int, ...]:
    try:
        return tuple(shape.siblings(cpu))
    except KeyError:  # a CPU the shape does not know (went offline): itself only
        return (cpu,)


def _treatment_mismatch(layer, t) -> Optional[str]:
    if layer.kind == CONFINED and not set(t.affinity) <= set(layer.cpus):
        return f"may run on CPUs {list(t.affinity)}, the layer owns {list(layer.cpus)}"
    wanted_policy = POLICY_BY_NAME.get(layer.policy, 0)
    if t.policy != wanted_policy and t.policy in POLICY_BY_NAME.values():
        return f"policy {t.policy}, the layer implies {wanted_policy} ({layer.policy})"
    if layer.nice is not None and layer.policy != "idle" and t.nice != layer.nice:
        return f"nice {t.nice}, the layer implies {layer.nice}"
    return None


class RateLimitedLog:
    """A persistent violation is logged at most once per interval per (invariant, layer)."""

    def __init__(self, interval_s: float = 300.0, clock=time.monotonic):
        self.interval_s = interval_s
        self.clock = clock
        self._last: Dict[Tuple[str, Optional[str]], float] = {}

    def report(self, violations: Iterable[Violation]) -> None:
        now = self.clock()
        for v in violations:
            key = (v.invariant, v.layer)
            if now - self._last.get(key, -1e18) >= self.interval_s:
                self._last[key] = now
                log.warning("lint %s: %s", v.invariant, v.message)
