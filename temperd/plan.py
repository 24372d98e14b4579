"""The LayerPlan: what the planner decides and every backend carries out.

Layer kinds follow scx_layered's vocabulary: a Confined layer runs only on its own CPUs,
a Grouped layer owns CPUs but may spill onto idle ones, an Open layer owns none.
The native backend reads the same plan as per-thread affinity, policy and nice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Tuple

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
