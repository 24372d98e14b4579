"""The planner: (machine shape, tiers, matched workloads, profiles) -> LayerPlan. Pure and deterministic.

Sizing rules (temper-profile(5), "cpu_fraction"):
- an exclusive group gets ceil(workload CPU budget x cpu_fraction) whole physical cores, or, once
  its threads' use is measured (decide/sizing.py), the whole cores that use needs where the
  budget gives that many; its members run on one CPU of each core and the SMT siblings are left
  idle, so two hot threads never share a core;
- the cores are owned (others may run there while the owners sleep) unless the group asks for a
  fence (`ownership = "fenced"`: nobody else runs there, even while the owners sleep);
- whole cores for exclusive groups come from what is left after a reserve for everything else
  (the lowest-numbered cores: CPU 0 carries most housekeeping and interrupts);
- a group whose whole-core demand exceeds what is left, or whose measured use needs more cores
  than its budget gives (pinned to fewer, a pool queues on them), is demoted to shared CPUs (an
  Open layer at the group's own nice: a pool raised to the latency nice took the CPU share of
  whatever ran beside it, a co-located client first, and bought nothing against the background
  tier, which yields anyway); the demotion is reported, never silent;
- critical-tier workloads without a profile get a tier layer.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import operator
import re
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from temperd.decide.matcher import Workload
from temperd.plan import (CONFINED, EXCLUSIVE, FENCED, GROUPED, LATENCY, OPEN, OWNED, TIERS, YIELD, CgroupWeight, Layer, LayerPlan, MemberSelector)
from temperd.config.daemon_config import CONFIG_SPEC, NO_IDLE_RESUME_BOUND, tier_defaults
from temperd.config.profile import Profile, ThreadGroup
from temperd.decide.sizing import NO_SIZING, Sizing

TIER_RANK = {tier: rank for rank, tier in enumerate(TIERS)}
# The slot of a plan's (settings, workload key -> _Part, the workloads as given): what plan_delta starts from.
PARTS = "_parts"
LAYER_NAME_MAX = 63
_TREATMENT = operator.attrgetter("treatment")


@dataclass(frozen=True)
class PlannerSettings:
    """What the planner takes from temperd.toml; each default is the configuration's."""

    reserve_cpus: int = CONFIG_SPEC.default_of("reserve_cpus")
    tier_weights: Tuple[Tuple[str, int], ...] = tuple(sorted(tier_defaults("weight").items()))
    idle_resume_us: Tuple[Tuple[str, int], ...] = tuple(sorted(tier_defaults("idle_resume_us").items()))  # per tier

    def weight_of(self, tier: str) -> int:
        return _by_tier(self.tier_weights)[tier]

    def owner_resume_of(self, tier: str) -> Optional[int]:
        """The resume bound on the CPUs the tier's exclusive groups own where their profile sets none."""
        bound = _by_tier(self.idle_resume_us).get(tier, NO_IDLE_RESUME_BOUND)
        return None if bound == NO_IDLE_RESUME_BOUND else bound


@functools.lru_cache(maxsize=16)
def _by_tier(pairs: Tuple[Tuple[str, int], ...]) -> Dict[str, int]:
    """A per-tier setting as a mapping, asked once per workload per plan: made once per configuration."""
    return dict(pairs)


def exclusive_cores(budget: float, cpu_fraction: float) -> int:
    """ceil(budget x fraction), robust to binary floating point (2.25 x 0.85 is 1.9125, not 1.91250001)."""
    return max(1, math.ceil(round(budget * cpu_fraction, 6)))


@functools.lru_cache(maxsize=8192)
def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-") or "w"


class _CoreAllocator:
    """Hands out whole cores from the highest-numbered end, keeping the reserve at the low end."""

    def __init__(self, shape, reserve_cpus: int):
        self.cores = sorted((tuple(sorted(c.cpus)) for c in shape.cores), key=lambda cpus: cpus[0])
        per_core = max(1, shape.threads_per_core)
        self.reserve_cores = min(len(self.cores), max(1, math.ceil(reserve_cpus / per_core)))
        self.free = list(reversed(self.cores[self.reserve_cores:]))  # highest first

    def available(self) -> int:
        return len(self.free)

    def take(self, n: int) -> List[Tuple[int, ...]]:
        taken, self.free = self.free[:n], self.free[n:]
        return sorted(taken)

    def spread(self, n: int) -> Tuple[int, ...]:
        """n CPUs, one per physical core before any second sibling; free cores first."""
        order = list(reversed(self.free)) + [c for c in self.cores if c not in self.free]
        cpus: List[int] = []
        for depth in range(max((len(c) for c in order), default=0)):
            for core in order:
                if depth < len(core) and len(cpus) < n:
                    cpus.append(core[depth])
        return tuple(sorted(cpus))


class PlanMemo:
    """What each workload that needs no CPUs of its own (Open layers only: latency and yield
    groups, the background tier) added to the previous plan, by the workload object it was made
    for: the matcher hands back the same object for a workload nothing changed in, so a replan
    after a batch of process events plans again only the workloads the batch touched. Only a
    cache: a plan is the same with or without one."""

    def __init__(self) -> None:
        self._parts: Dict[int, _Part] = {}
        self._kept: Dict[int, _Part] = {}
        self._settings: Optional[PlannerSettings] = None

    def begin(self, settings: "PlannerSettings") -> None:
        """A plan starts: what was made under other settings is forgotten."""
        if settings != self._settings:
            self._parts = {}
            self._settings = settings

    def get(self, workload: Workload, profile: Optional[Profile]) -> Optional["_Part"]:
        part = self._parts.get(id(workload))
        if part is None or part.workload is not workload or part.profile is not profile:
            return None
        self._kept[id(workload)] = part
        return part

    def put(self, part: "_Part") -> None:
        self._kept[id(part.workload)] = part

    def turn(self) -> None:
        """One plan done: what it did not use is dropped."""
        self._parts, self._kept = self._kept, {}


@dataclass(frozen=True)
class _Part:
    """What one workload added to a plan: its layers (named as they were asked for: no other
    workload's layer had taken the name) and its lines of the plan's decisions."""

    workload: Workload
    profile: Optional[Profile]
    weight: Optional[CgroupWeight]
    names: Tuple[str, ...]
    layers: Tuple[Layer, ...]
    decisions: Tuple[str, ...]


def _needs_no_cpus(workload: Workload, profile: Optional[Profile]) -> bool:
    if profile is None:
        return workload.tier != "critical" or workload.budget is None
    return EXCLUSIVE not in map(_TREATMENT, profile.thread_groups)  # asked for every workload planned again


def plan(shape, workloads: Sequence[Workload], profiles: Mapping[str, Profile],
         settings: PlannerSettings = PlannerSettings(), sizing: Sizing = NO_SIZING,
         memo: Optional[PlanMemo] = None) -> LayerPlan:
    """sizing: what the exclusive groups' threads were measured to use, and the size each was
    given by the previous plan (decide/sizing.py); without it, exclusive groups are sized from
    their budgets. memo: what the previous plan's workloads without CPUs of their own added
    (PlanMemo), or None."""
    alloc = _CoreAllocator(shape, settings.reserve_cpus)
    reserve = tuple(sorted(cpu for core in alloc.cores[: alloc.reserve_cores] for cpu in core))
    decisions = [f"reserve for everything else: CPUs {_cpus(reserve)} ({alloc.reserve_cores} whole core(s) "
                 f"for reserve_cpus = {settings.reserve_cpus})",
                 f"{alloc.available()} of {len(alloc.cores)} core(s) available for exclusive groups"]
    layers: List[Layer] = []
    errors: List[str] = []
    weights: List[CgroupWeight] = []
    names: Dict[str, int] = {}
    asked: List[Tuple[str, str]] = []  # (the name asked for, the name given), for the workload at hand

    def unique(name: str) -> str:
        name = name[:LAYER_NAME_MAX]
        given = name
        if name in names:
            names[name] += 1
            suffix = f"-{names[name]}"
            given = name[: LAYER_NAME_MAX - len(suffix)] + suffix
        names.setdefault(given, 1)
        asked.append((name, given))
        return given

    if memo is not None:
        memo.begin(settings)
    parts: Dict[str, _Part] = {}  # what each workload added: a later plan_delta replaces only some
    ordered = sorted(workloads, key=lambda w: (TIER_RANK.get(w.tier, 99), w.key))
    for workload in ordered:
        profile = profiles.get(workload.profile_id) if workload.profile_id else None
        part = memo.get(workload, profile) if memo is not None else None
        if part is not None and names.keys().isdisjoint(part.names):
            if part.weight is not None:
                weights.append(part.weight)
            names.update(dict.fromkeys(part.names, 1))
            layers.extend(part.layers)
            decisions.extend(part.decisions)
            parts[workload.key] = part
            continue
        tier_weight = settings.weight_of(workload.tier)
        weight = CgroupWeight(workload.key, workload.tier, tier_weight, workload.unit, workload.cgroup) \
            if workload.unit or workload.cgroup else None
        if weight is not None:
            weights.append(weight)
        if workload.profile_id and profile is None:
            errors.append(f"workload {workload.key}: profile {workload.profile_id!r} is not loaded")
            continue
        asked.clear()
        made, said = _workload_layers(workload, profile, alloc, tier_weight, unique, sizing,
                                      settings.owner_resume_of(workload.tier))
        layers.extend(made)
        decisions.extend(said)
        part = _Part(workload, profile, weight, tuple(given for _name, given in asked), tuple(made), tuple(said))
        parts[workload.key] = part
        if memo is not None and _needs_no_cpus(workload, profile) and all(name == given for name, given in asked):
            memo.put(part)
    if memo is not None:
        memo.turn()
    made_plan = LayerPlan(layers=tuple(layers), reserve_cpus=reserve, decisions=tuple(decisions),
                          errors=tuple(errors), cgroup_weights=tuple(weights))
    # Beside the fields, as its cached properties; the workloads as given (the matcher's list:
    # the next match names it as the one it changed, MatchResult.since).
    made_plan.__dict__[PARTS] = (settings, parts, workloads if isinstance(workloads, (list, tuple)) else tuple(workloads))
    return made_plan


def _workload_layers(workload: Workload, profile: Optional[Profile], alloc: "_CoreAllocator", tier_weight: int,
                     unique, sizing: Sizing, owner_resume: Optional[int] = None) -> Tuple[List[Layer], List[str]]:
    """One workload's layers, and the lines it adds to the plan's decisions."""
    said: List[str] = []
    if profile is None:
        if workload.tier not in ("critical", "background"):
            return [], said
        return [_tier_layer(workload, alloc, tier_weight, unique)], said
    made = []
    for group in profile.thread_groups:
        layer = _group_layer(workload, group, alloc, unique(f"{_slug(workload.key)}.{group.name}"), said, sizing,
                             owner_resume)
        if layer is not None:
            made.append(layer)
    return _fence_catch_all(workload, profile, made), said


def _fence_catch_all(workload: Workload, profile: Profile, made: List[Layer]) -> List[Layer]:
    """A catch-all takes only the threads no other group claims. A backend places a thread the
    plan does not name by the layers' rules, so the catch-all's rule must leave out the threads of
    groups that have no layer (an untrusted match's exclusive and latency groups: declining to
    raise them must not lower them) and the threads the matcher put in no group."""
    at = next((i for i, layer in enumerate(made) if layer.selector.catch_all), None)
    if at is None:
        return made
    laid = {layer.group for layer in made}
    left = [g for g in profile.thread_groups if not g.catch_all and g.name not in laid]
    ungrouped = tuple(t.tid for t in workload.threads if t.group is None)
    if not left and not ungrouped:
        return made
    sel = made[at].selector
    made[at] = dataclasses.replace(made[at], selector=dataclasses.replace(
        sel, excluded_comm_patterns=tuple(p for g in left for p in g.thread_names),
        excluded_title_patterns=tuple(p for g in left for p in g.process_titles), excluded_tids=ungrouped))
    return made


def _resume_text(bound: int, tier: str) -> str:
    what = ("idle, the CPUs poll for the owner's next wakeup (never a sleep state)" if bound == 0 else
            f"idle, the CPUs stay out of sleep states slower than {bound} us to leave")
    return f"{what}: the {tier} tier's idle_resume_us"


def _selector(workload: Workload, group: Optional[ThreadGroup], tids: Tuple[int, ...]) -> MemberSelector:
    return MemberSelector(
        cgroup=workload.cgroup if workload.unit else None,
        pids=workload.pids,
        comm_patterns=group.thread_names if group else (),
        title_patterns=group.process_titles if group else (),
        tids=tids,
        catch_all=bool(group and group.catch_all) or group is None,
    )


def _group_layer(workload: Workload, group: ThreadGroup, alloc: _CoreAllocator, name: str, decisions: List[str],
                 sizing: Sizing = NO_SIZING, owner_resume: Optional[int] = None) -> Optional[Layer]:
    """owner_resume: the tier's resume bound for the CPUs of an exclusive group whose profile sets none."""
    members = workload.members(group.name)
    where = f"{workload.key} group {group.name}"
    if not members:
        decisions.append(f"{where}: no member threads now, no layer")
        return None
    reasons = [f"{len(members)} member thread(s): {group.describe_selector()}"]
    common = dict(name=name, tier=workload.tier, workload=workload.key,
                  group=group.name, selector=_selector(workload, group, members), weight=group.weight)
    if group.treatment == EXCLUSIVE:
        want, over_budget = _exclusive_size(workload, group, sizing, reasons)
        if want <= alloc.available() and not over_budget:
            cores = alloc.take(want)
            cpus = tuple(core[0] for core in cores)
            siblings = tuple(cpu for core in cores for cpu in core[1:])
            reasons.append(f"Confined on CPUs {_cpus(cpus)}, {group.ownership}: " + _OWNERSHIP_TEXT[group.ownership]
                           + (f"; SMT siblings {_cpus(siblings)} left idle" if siblings else ""))
            resume = group.idle_resume_us
            if resume is None and owner_resume is not None:
                resume = owner_resume
                reasons.append(_resume_text(resume, workload.tier))
            return Layer(kind=CONFINED, treatment=EXCLUSIVE, cpus=cpus, idle_siblings=siblings, protected=True,
                         nice=group.nice, slice_us=group.slice_us, idle_resume_us=resume,
                         ownership=group.ownership, reasons=tuple(reasons), **common)
        text = f"demoted to shared CPUs at nice {group.nice}: needs {want} whole core(s), " + (
            over_budget or f"only {alloc.available()} left after the reserve and earlier exclusive groups")
        reasons.append(text)
        decisions.append(f"{where}: {text}")
        return Layer(kind=OPEN, treatment=LATENCY, nice=group.nice, slice_us=group.slice_us,
                     idle_resume_us=group.idle_resume_us, reasons=tuple(reasons), **common)
    common["treatment"] = group.treatment
    if group.treatment == LATENCY:
        reasons.append(f"latency: nice {group.nice}" + (f", slice {group.slice_us} us" if group.slice_us else ""))
        return Layer(kind=OPEN, nice=group.nice, slice_us=group.slice_us, idle_resume_us=group.idle_resume_us,
                     reasons=tuple(reasons), **common)
    assert group.treatment == YIELD
    if group.yield_policy == "idle":
        reasons.append("yield: SCHED_IDLE, runs only when nothing else wants the CPU")
        return Layer(kind=OPEN, policy="idle", reasons=tuple(reasons), **common)
    reasons.append(f"yield: SCHED_BATCH, nice {group.nice}")
    return Layer(kind=OPEN, policy="batch", nice=group.nice, reasons=tuple(reasons), **common)


_OWNERSHIP_TEXT = {
    OWNED: "its threads run there first; other work may use them while they sleep",
    FENCED: "no other thread runs there, even while its threads sleep",
}


def _exclusive_size(workload: Workload, group: ThreadGroup, sizing: Sizing, reasons: List[str]) -> Tuple[int, str]:
    """Whole cores for an exclusive group: its budget's share, or what its measured use needs;
    and why that does not fit its budget ("" when it does). Pinning a pool to fewer cores than
    it uses would make it queue on them: such a group is demoted instead."""
    if workload.budget is not None:
        bound = exclusive_cores(workload.budget, group.cpu_fraction)
        why = (f"ceil({workload.budget:g} CPUs x cpu_fraction {group.cpu_fraction:g}) = {bound} whole core(s) "
               f"({workload.budget_reason})")
    else:
        bound = len(workload.members(group.name))
        why = f"{bound} whole core(s), one per member thread ({workload.budget_reason})"
    measured, measured_why = sizing.cores((workload.key, group.name))
    if measured is None:
        reasons.append(why + (f"; not sized by use: {measured_why}" if sizing is not NO_SIZING else ""))
        return bound, ""
    reasons.append(f"{measured_why}: {measured} whole core(s) (at most {why})")
    return measured, (f"more than its budget gives ({why})" if measured > bound else "")


def _tier_layer(workload: Workload, alloc: _CoreAllocator, weight: int, unique) -> Layer:
    """The layer of a critical or background tier workload without a profile."""
    tids = tuple(t.tid for t in workload.threads)
    common = dict(name=unique(f"{_slug(workload.key)}.tier"), tier=workload.tier, workload=workload.key, group="",
                  selector=_selector(workload, None, tids), weight=weight)
    if workload.tier == "background":
        # All of it yields (SCHED_IDLE): cgroup weights alone do not reach hosts without a cgroup
        # v2 cpu controller, and not across one session's threads.
        return Layer(kind=OPEN, treatment=YIELD, policy="idle", reasons=(
            f"background tier without a profile: yields (SCHED_IDLE), weight {weight}",), **common)
    common["treatment"] = LATENCY
    if workload.budget is None:
        return Layer(kind=OPEN, reasons=(f"critical tier without a profile: weight {weight}; {workload.budget_reason}",), **common)
    want = exclusive_cores(workload.budget, 1.0)
    cpus = alloc.spread(want)
    return Layer(kind=GROUPED, cpus=cpus, reasons=(
        f"critical tier without a profile: Grouped on {want} CPU(s) {_cpus(cpus)} spread over physical cores "
        f"({workload.budget_reason})",), **common)


def _cpus(cpus: Sequence[int]) -> str:
    return ",".join(str(c) for c in cpus) or "none"
