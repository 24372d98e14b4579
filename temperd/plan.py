"""The LayerPlan: what the planner decides and every backend carries out.

Layer kinds follow scx_layered's vocabulary: a Confined layer runs only on its own CPUs,
a Grouped layer owns CPUs but may spill onto idle ones, an Open layer owns none.
The native backend reads the same plan as per-thread affinity, policy and nice.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Dict, FrozenSet, Optional, Tuple

CONFINED = "Confined"
GROUPED = "Grouped"
OPEN = "Open"
LAYER_KINDS = (CONFINED, GROUPED, OPEN)

EXCLUSIVE = "exclusive"
LATENCY = "latency"
YIELD = "yield"
TREATMENTS = (EXCLUSIVE, LATENCY, YIELD)

TIERS = ("critical", "standard", "background")

# What `exclusive` means for the CPUs an exclusive layer holds. OWNED: the layer's threads run
# there first and other work may borrow the CPUs while the owners sleep, yielding at once when
# an owner wakes. FENCED: no other thread runs there, even while the owners sleep (caches kept
# warm at the cost of idle capacity).
OWNED = "owned"
FENCED = "fenced"
OWNERSHIPS = (OWNED, FENCED)


@dataclass(frozen=True)
class MemberSelector:
    """Which threads belong to a layer.

    `tids` is the membership the planner saw; `cgroup`, `comm_patterns`, `title_patterns` and
    `pids` describe it so a backend that matches by rule (scx_layered) can express it.
    """

    cgroup: Optional[str] = None  # cgroup v2 path of the workload's unit, e.g. /system.slice/x.service
    pids: Tuple[int, ...] = ()  # thread-group ids of the workload's processes
    comm_patterns: Tuple[str, ...] = ()  # thread-name globs from the profile
    title_patterns: Tuple[str, ...] = ()  # process-title regexes from the profile
    tids: Tuple[int, ...] = ()  # the member threads at planning time
    catch_all: bool = False  # the workload's remaining threads


@dataclass(frozen=True)
class Layer:
    name: str  # unique, ASCII, <= 63 bytes
    kind: str  # CONFINED | GROUPED | OPEN
    treatment: str  # EXCLUSIVE | LATENCY | YIELD
    tier: str
    workload: str  # the workload key this layer serves ("" for tier/catch-all layers)
    group: str  # thread group name ("" for tier layers)
    selector: MemberSelector
    cpus: Tuple[int, ...] = ()  # CPUs the layer owns (Confined/Grouped); () = none (Open)
    idle_siblings: Tuple[int, ...] = ()  # SMT siblings of owned cores, kept idle
    weight: int = 100
    nice: Optional[int] = None
    slice_us: Optional[int] = None
    policy: str = "other"  # "other" | "batch" | "idle"
    idle_resume_us: Optional[int] = None
    protected: bool = False
    ownership: str = FENCED  # OWNED | FENCED; meaningful for CONFINED/GROUPED exclusive layers
    reasons: Tuple[str, ...] = ()

    @property
    def holds_cpus(self) -> Optional[str]:
        """OWNED or FENCED for an exclusive layer on CPUs of its own; None for every other layer."""
        return self.ownership if self.kind == CONFINED and self.treatment == EXCLUSIVE and self.cpus else None


@dataclass(frozen=True)
class CgroupWeight:
    """A tier's standing against other workloads: cgroup v2 cpu.weight of a workload's unit."""

    workload: str
    tier: str
    weight: int  # 1..10000, the cgroup v2 cpu.weight scale
    unit: Optional[str] = None  # systemd unit, set through systemd
    cgroup: Optional[str] = None


@dataclass(frozen=True)
class LayerPlan:
    layers: Tuple[Layer, ...]
    reserve_cpus: Tuple[int, ...]  # CPUs kept for everything else
    decisions: Tuple[str, ...] = ()  # plan-level reasons (demotions, reserve size, ...)
    errors: Tuple[str, ...] = ()  # what could not be planned
    cgroup_weights: Tuple[CgroupWeight, ...] = field(default_factory=tuple)

    def layer(self, name: str) -> Layer:
        for layer in self.layers:
            if layer.name == name:
                return layer
        raise KeyError(name)

    @functools.cached_property
    def treatment_by_tid(self) -> Dict[int, tuple]:
        """tid -> what its layer asks of it (the first layer that names it, as the backends read
        it). Kept: the plan in force is compared with the next one at every batch of events."""
        out: Dict[int, tuple] = {}
        for layer in self.layers:
            treatment = (layer.name, layer.kind, layer.treatment, layer.cpus, layer.nice, layer.slice_us,
                         layer.policy, layer.ownership)
            for tid in layer.selector.tids:
                out.setdefault(tid, treatment)
        return out


def host_wide(plan: LayerPlan) -> tuple:
    """What a plan asks of threads outside its layers and of the host itself: the reserve, the
    CPUs of Confined layers (every other thread is kept off them), the PM QoS bounds and the
    tiers' cgroup weights. Two plans equal in this differ only in who is a member of what."""
    owned = tuple(sorted((l.kind, l.cpus, l.idle_siblings, l.idle_resume_us, l.ownership)
                         for l in plan.layers if l.cpus or l.idle_resume_us is not None))
    weights = frozenset((w.unit, w.cgroup, w.weight) for w in plan.cgroup_weights)
    return plan.reserve_cpus, owned, weights


def moved_members(old: LayerPlan, new: LayerPlan) -> Optional[FrozenSet[int]]:
    """The thread ids whose treatment differs between two plans (a member of another layer, or
    of a layer that treats it differently, or of a layer in one plan only); None when the plans
    differ beyond their members (host_wide), so that every thread may be affected."""
    if host_wide(old) != host_wide(new):
        return None
    before, after = old.treatment_by_tid, new.treatment_by_tid
    moved = {tid for tid, treatment in after.items() if before.get(tid) != treatment}
    moved.update(tid for tid in before if tid not in after)
    return frozenset(moved)
