"""A plan made again for the workloads a batch of process events changed, and for no other.

plan() walks every live workload; after a batch of process events most of them are the very
objects the matcher handed back last time (it builds again only the workloads whose processes
changed). plan_delta starts from the plan in force and what each workload added to it
(planner._Part, kept beside the plan), takes out the layers, decision lines and cgroup weight
of the workloads that changed or ended, and adds those of the changed ones, planned alone.

It declines (None: the caller makes the whole plan) where one workload's change reaches
others: a workload that holds or wants CPUs of its own (an exclusive group, a critical tier
with a budget: the CPUs of every later one would move), a PM QoS bound, a tier change, a
profile that is not loaded, or other settings. A layer name another workload already has gets
the first free suffix (plan() gives them in its order of workloads). The layers of the workloads
it planned again go at the end: no layer of one workload selects another's threads, so their
order is the plan's only where a backend tries one workload's layers in turn, and those keep theirs.
"""

from __future__ import annotations

import dataclasses
import itertools
import operator
import weakref
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple, Union

from temperd.config.profile import Profile
from temperd.decide.matcher import MatchResult, Workload
from temperd.decide.planner import LAYER_NAME_MAX, PARTS, PlannerSettings, _needs_no_cpus, _Part, _workload_layers
from temperd.decide.sizing import NO_SIZING
from temperd.plan import CgroupWeight, Layer, LayerPlan

NAMES = "_names"  # the slot of a plan's set of layer names
# The slots of a plan's layers by id and cgroup weights by workload key (_edited).
LAYERS_BY_ID = "_layers_by_id"
WEIGHTS_BY_WORKLOAD = "_weights_by_workload"
_WORKLOAD = operator.attrgetter("workload")


class _Declined(Exception):
    """A change that needs the whole plan."""


def plan_delta(previous: LayerPlan, match: Union[MatchResult, Sequence[Workload]], profiles: Mapping[str, Profile],
               settings: PlannerSettings) -> Optional[LayerPlan]:
    """The plan for the match's workloads made from `previous` by planning again only the
    workloads that are not the objects `previous` was made for; `previous` itself where none
    changed what it asks; None where the whole plan must be made (see the module's docstring).
    A MatchResult made right after the one `previous` was planned for says what changed
    (MatchResult.updated, .ended): no other workload is looked at."""
    kept = previous.__dict__.get(PARTS)
    if kept is None or kept[0] != settings or previous.errors:
        return None
    parts: Dict[str, _Part] = kept[1]
    if isinstance(match, MatchResult) and match.since is not None and match.since is kept[2]:
        changed, gone = _updated(parts, match)
    else:
        changed, gone = _changed(parts, kept[2], match.workloads if isinstance(match, MatchResult) else match)
    workloads = match.workloads if isinstance(match, MatchResult) else tuple(match)
    if not changed and not gone:
        previous.__dict__[PARTS] = (settings, parts, workloads)  # the next match's `since`
        return previous
    try:
        return _delta(previous, parts, changed, gone, profiles, settings, workloads)
    except _Declined:
        return None


def _updated(parts: Dict[str, _Part], match: MatchResult) -> Tuple[List[Workload], List[str]]:
    """_changed from what the match says it built again and ended since the match the plan was made for."""
    changed = [w for w in match.updated if getattr(parts.get(w.key), "workload", None) is not w]
    return changed, [key for key in match.ended if key in parts]


def _changed(parts: Dict[str, _Part], before: Sequence[Workload],
             workloads: Sequence[Workload]) -> Tuple[List[Workload], List[str]]:
    """The workloads that are not the objects the plan was made for (the matcher hands back the
    very object it did not rebuild), and the keys of those that ended. The matcher keeps its
    workloads in the order of their keys: where none came or went, the positions that differ
    are found without a step of Python per workload."""
    if len(workloads) == len(before):
        suspects: Iterable[Workload] = itertools.compress(workloads, map(operator.is_not, workloads, before))
    else:
        suspects = workloads
    changed = [w for w in suspects if getattr(parts.get(w.key), "workload", None) is not w]
    gone: List[str] = []
    if len(workloads) != len(parts) or any(w.key not in parts for w in changed):
        now = {w.key for w in workloads}
        gone = [key for key in parts if key not in now]
    return changed, gone


def _delta(previous: LayerPlan, parts: Dict[str, _Part], changed: List[Workload], gone: List[str],
           profiles: Mapping[str, Profile], settings: PlannerSettings, workloads: Sequence[Workload]) -> LayerPlan:
    touched = {w.key for w in changed} | set(gone)
    old_parts = [parts[key] for key in touched if key in parts]
    removed = [layer for part in old_parts for layer in part.layers]
    if any(_reaches_others(layer) for layer in removed):
        raise _Declined
    names = set(_names(previous))
    names.difference_update(layer.name for layer in removed)
    new_parts = [_plan_one(w, parts.get(w.key), profiles, settings, names) for w in changed]
    if not gone and all(_same(parts.get(new.workload.key), new) for new in new_parts):
        for new in new_parts:  # the plan in force stands; its record names the workloads now
            parts[new.workload.key] = dataclasses.replace(parts[new.workload.key], workload=new.workload)
        previous.__dict__[PARTS] = (settings, parts, workloads)
        return previous
    added = [layer for part in new_parts for layer in part.layers]
    dropped = {line for part in old_parts for line in part.decisions}
    layers, by_id = _edited(previous, LAYERS_BY_ID, previous.layers, id, map(id, removed), added)
    weights, by_workload = _weights(previous, old_parts, new_parts, touched)
    plan = LayerPlan(
        layers=layers,
        reserve_cpus=previous.reserve_cpus,
        decisions=(_without(previous.decisions, dropped.__contains__) if dropped else previous.decisions)
        + tuple(line for part in new_parts for line in part.decisions),
        errors=(),
        cgroup_weights=weights)
    for slot, index in ((LAYERS_BY_ID, by_id), (WEIGHTS_BY_WORKLOAD, by_workload)):
        if index is not None:
            plan.__dict__[slot] = index
    index = dict(parts)
    for key in gone:
        del index[key]
    index.update((part.workload.key, part) for part in new_parts)
    # What the plan's cached properties and layer_changes would find by walking every layer.
    plan.__dict__[PARTS] = (settings, index, workloads)
    plan.__dict__[NAMES] = names
    plan.__dict__["_changes"] = (weakref.ref(previous), (removed, added))
    if plan.cgroup_weights is not previous.cgroup_weights:  # what the backend holds only these of
        plan.__dict__["_weight_changes"] = (weakref.ref(previous), (
            tuple(part.weight for part in old_parts if part.weight is not None),
            tuple(part.weight for part in new_parts if part.weight is not None)))
    plan.__dict__["host_wide"] = previous.host_wide  # no layer on CPUs of its own came or went
    return plan


def _without(items: tuple, drop: Callable[[Any], bool], key: Optional[Callable[[Any], Any]] = None) -> tuple:
    """items less those whose key drop() says, in a pass the interpreter makes in C (the plan's
    thousands of layers, a few of them dropped): no step of Python per item for builtin keys."""
    keys = items if key is None else map(key, items)
    return tuple(itertools.compress(items, map(operator.not_, map(drop, keys))))


def _edited(previous: LayerPlan, slot: str, items: tuple, key: Callable[[Any], Any], dropped: Iterable,
            added: Sequence) -> Tuple[tuple, Optional[Dict[Any, Any]]]:
    """items less those of the dropped keys, then the added ones; and the mapping key -> item of
    the result, for the plan made of it to keep in `slot`. The mapping is taken from `previous`
    (a plan is planned from once: the next delta starts from the plan made now; one without it
    makes it anew) and edited in place: no step of Python per item (the plan's thousands of layers,
    a few of them changed). Where two items share a key, by a walk over items and no mapping."""
    edited = previous.__dict__.pop(slot, None)
    if edited is None:
        edited = dict(zip(map(key, items), items))
        if len(edited) != len(items):
            return _without(items, set(dropped).__contains__, key) + tuple(added), None
    for gone in dropped:
        edited.pop(gone, None)
    keys = list(map(key, added))
    if len(set(keys)) != len(keys) or not edited.keys().isdisjoint(keys):
        return tuple(edited.values()) + tuple(added), None  # a key taken twice: no mapping of this plan
    edited.update(zip(keys, added))
    return tuple(edited.values()), edited


def _weights(previous: LayerPlan, old_parts: List[_Part], new_parts: List[_Part],
             touched: Set[str]) -> Tuple[tuple, Optional[Dict[str, CgroupWeight]]]:
    """The plan's cgroup weights, and them by workload (_edited): the very tuple in force where the
    touched workloads' are as they were (a thread that came or went), so that the backend sees no
    change and reads none of them."""
    if len(old_parts) == len(new_parts) and all(
            parts_weight == new.weight for parts_weight, new in zip(
                (p.weight for p in sorted(old_parts, key=lambda p: p.workload.key)),
                sorted(new_parts, key=lambda p: p.workload.key))):
        return previous.cgroup_weights, previous.__dict__.pop(WEIGHTS_BY_WORKLOAD, None)  # handed on (_edited)
    return _edited(previous, WEIGHTS_BY_WORKLOAD, previous.cgroup_weights, _WORKLOAD, touched,
                   [part.weight for part in new_parts if part.weight is not None])


def _reaches_others(layer: Layer) -> bool:
    """A layer whose coming or going changes what other threads get: CPUs of its own (everyone
    else is kept off them, later exclusive groups move), a PM QoS bound."""
    return bool(layer.cpus) or layer.idle_resume_us is not None


def _plan_one(workload: Workload, before: Optional[_Part], profiles: Mapping[str, Profile],
              settings: PlannerSettings, names: Set[str]) -> _Part:
    profile = profiles.get(workload.profile_id) if workload.profile_id else None
    if (workload.profile_id and profile is None) or not _needs_no_cpus(workload, profile):
        raise _Declined
    if before is not None and before.workload.tier != workload.tier:
        raise _Declined  # its cgroup weight and its place among the others change
    given: List[str] = []

    def unique(name: str) -> str:
        """As plan() names a layer, but for the suffix of a name taken (keys cut at the
        length limit meet): the first free one here, where plan() counts in its order of
        workloads. The names stay unique; a workload keeps its layers' names while it lives."""
        name = name[:LAYER_NAME_MAX]
        count = 1
        while name in names:
            count += 1
            suffix = f"-{count}"
            name = name[:LAYER_NAME_MAX - len(suffix)] + suffix
        names.add(name)
        given.append(name)
        return name

    tier_weight = settings.weight_of(workload.tier)
    made, said = _workload_layers(workload, profile, None, tier_weight, unique, NO_SIZING,
                                  settings.owner_resume_of(workload.tier))
    if any(_reaches_others(layer) for layer in made):
        raise _Declined
    weight = CgroupWeight(workload.key, workload.tier, tier_weight, workload.unit, workload.cgroup) \
        if workload.unit or workload.cgroup else None
    return _Part(workload, profile, weight, tuple(given), tuple(made), tuple(said))


def _same(before: Optional[_Part], after: _Part) -> bool:
    return (before is not None and before.layers == after.layers and before.decisions == after.decisions
            and before.weight == after.weight)


def _names(plan: LayerPlan) -> Set[str]:
    names = plan.__dict__.get(NAMES)
    if names is None:
        names = plan.__dict__[NAMES] = {layer.name for layer in plan.layers}
    return names
