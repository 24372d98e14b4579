"""The LayerPlan: what the planner decides and every backend carries out.

Layer kinds follow scx_layered's vocabulary: a Confined layer runs only on its own CPUs,
a Grouped layer owns CPUs but may spill onto idle ones, an Open layer owns none.
The native backend reads the same plan as per-thread affinity, policy and nice.
"""

from __future__ import annotations

import functools
import weakref
from dataclasses import dataclass, field
from typing import Dict, FrozenSet, List, Optional, Sequence, Tuple

CONFINED = "Confined"
GROUPED = "Grouped"
OPEN = "Open"

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
    # Threads a catch-all leaves alone: those another group of the profile claims where that group
    # has no layer (not granted to an untrusted process, or no members now), by name, title or tid.
    # Without these an untrusted match's declined threads would fall to its catch-all (a yield).
    excluded_comm_patterns: Tuple[str, ...] = ()
    excluded_title_patterns: Tuple[str, ...] = ()
    excluded_tids: Tuple[int, ...] = ()


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
    # OWNED | FENCED, meaningful for CONFINED/GROUPED exclusive layers; the default is a thread
    # group's (GROUP_SPEC in temperd/config/profile.py, which this base cannot import; a test holds them equal).
    ownership: str = OWNED
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
    def members(self) -> "TidLayers":
        """tid -> the first layer that names it (as the backends read it). Kept: the native
        backend reads it for every thread, and the next plan's is derived from it (carry_members)."""
        return TidLayers.build(self)

    @functools.cached_property
    def host_wide(self) -> tuple:
        """What the plan asks of threads outside its layers: the reserve, the CPUs of Confined
        layers (every other thread is kept off them) and the PM QoS bounds. Two plans equal in
        this differ only in who is a member of what, and in the workloads' cgroup weights (each
        its own workload's, applied by itself)."""
        owned = tuple(sorted((l.kind, l.cpus, l.idle_siblings, l.idle_resume_us, l.ownership)
                             for l in self.layers if l.cpus or l.idle_resume_us is not None))
        return self.reserve_cpus, owned


class TidLayers:
    """Each member tid's layer: the first layer of the plan that names it. `shared`: some tid is
    named by more than one layer (then the order of layers decides, and a plan derived from this
    one is built in full)."""

    def __init__(self, by_tid: Dict[int, Layer], shared: bool):
        self.by_tid = by_tid
        self.shared = shared

    @classmethod
    def build(cls, plan: LayerPlan) -> "TidLayers":
        by_tid: Dict[int, Layer] = {}
        named = 0
        for layer in plan.layers:
            named += len(layer.selector.tids)
            for tid in layer.selector.tids:
                by_tid.setdefault(tid, layer)
        return cls(by_tid, named != len(by_tid))

    def after(self, plan: LayerPlan, removed: Sequence[Layer], added: Sequence[Layer]) -> "TidLayers":
        """The members of `plan`, which has this one's layers but `removed`, and `added`: a fork
        storm changes a few layers a batch, and the host's every member need not be walked."""
        if self.shared:
            return TidLayers.build(plan)
        by_tid = dict(self.by_tid)
        for layer in removed:
            for tid in layer.selector.tids:
                del by_tid[tid]
        for layer in added:
            for tid in layer.selector.tids:
                if tid in by_tid:
                    return TidLayers.build(plan)  # named twice: the order of layers decides
                by_tid[tid] = layer
        return TidLayers(by_tid, False)


def layer_changes(old: LayerPlan, new: LayerPlan) -> Tuple[List[Layer], List[Layer]]:
    """(the layers of `old` that `new` lacks, those of `new` that `old` lacks), by identity: a
    plan reuses the layer objects of the workloads it did not plan again (planner.PlanMemo)."""
    kept = new.__dict__.get("_changes")  # (a reference to the old plan, its changes): asked twice a batch
    if kept is not None and kept[0]() is old:
        return kept[1]
    old_ids = {id(layer) for layer in old.layers}
    new_ids = {id(layer) for layer in new.layers}
    changes = ([layer for layer in old.layers if id(layer) not in new_ids],
               [layer for layer in new.layers if id(layer) not in old_ids])
    new.__dict__["_changes"] = (weakref.ref(old), changes)
    return changes


def weight_changes(old: LayerPlan, new: LayerPlan) -> Optional[Tuple[tuple, tuple]]:
    """(the cgroup weights of `old` that `new` lacks, those of `new` that `old` lacks) where the
    plan that made `new` from `old` kept them (decide/plan_delta.py); None: not known."""
    kept = new.__dict__.get("_weight_changes")
    return kept[1] if kept is not None and kept[0]() is old else None


def treatment(layer: Optional[Layer]) -> Optional[tuple]:
    """What a layer asks of its members, as the native backend carries it out."""
    if layer is None:
        return None
    return (layer.name, layer.kind, layer.treatment, layer.cpus, layer.nice, layer.slice_us,
            layer.policy, layer.ownership)


def carry_members(old: LayerPlan, new: LayerPlan) -> Tuple[List[Layer], List[Layer]]:
    """Gives `new` the member index derived from `old`'s (only the members of layers in one plan
    only can differ), in the slot functools.cached_property would fill, instead of one built from
    every layer; returns those layers (old's removed, new's added) for moved_members."""
    removed, added = layer_changes(old, new)
    if "members" in old.__dict__ and "members" not in new.__dict__:
        new.__dict__["members"] = old.members.after(new, removed, added)
    return removed, added


def moved_members(old: LayerPlan, new: LayerPlan, removed: Sequence[Layer],
                  added: Sequence[Layer]) -> Optional[FrozenSet[int]]:
    """The thread ids whose treatment differs between two plans (a member of another layer, or
    of a layer that treats it differently, or of a layer in one plan only), given the layers in
    one plan only (carry_members); None when the plans differ beyond their members (host_wide),
    so that every thread may be affected."""
    if old.host_wide != new.host_wide:
        return None
    before, after = old.members, new.members
    if before.shared or after.shared:  # the order of layers decides, and it may have changed
        changed = [*before.by_tid, *after.by_tid]
    else:
        changed = [tid for layer in (*removed, *added) for tid in layer.selector.tids]
    treatments: Dict[int, Optional[tuple]] = {}  # id(layer) -> its treatment, made once per layer

    def treated(layer: Optional[Layer]) -> Optional[tuple]:
        if id(layer) not in treatments:
            treatments[id(layer)] = treatment(layer)
        return treatments[id(layer)]

    return frozenset(tid for tid in changed if treated(before.by_tid.get(tid)) != treated(after.by_tid.get(tid)))
