"""How many whole cores an exclusive group gets from what its threads were measured to use.

Pure. The demand of a group is the p95 of what its threads use together, from the rightsizing
history (observe/usage_history.py), which fills from a workload's first sample on: until
MIN_SAMPLES samples exist (the first minute's share of them), the group is sized from its
declared budget alone. The measured size is bounded by that budget and by the host; a group
whose measured size does not fit is demoted by the planner.

Re-sizing has hysteresis so that a demand near a core boundary does not flap the plan: a group
grows as soon as its demand needs another core, and shrinks only when one core fewer would be at
most SHRINK_BUSY busy.

A pool of more threads than the cores its demand asks for, whose demand fills those cores (at
least POOL_FULL of them), gets one core more. Its use there is what the cores let it do, not what
it wants: four PostgreSQL backends on the one core of `cpus = 1.0` measured 1.03 CPUs while they
waited twice that on its runqueue, the other CPU a third idle, and were kept on it by their own
measurement.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from temperd.decide.rightsize import STARVED_SHARE_MAY_BE_HOT
from temperd.plan import EXCLUSIVE


MIN_SAMPLES = 30  # samples (1 s each by default) before a measured demand is trusted
GROW_TOLERANCE = 0.05  # CPUs over a whole number that do not yet ask for another core
SHRINK_BUSY = 0.8  # a smaller size must leave this much headroom before a group shrinks to it
# A pool using this share of its cores or more fills them (module docstring): the history's buckets
# are 5 % apart, and a pool held on its cores reads 0.93-1.03 of them.
POOL_FULL = 0.9

GroupKey = Tuple[str, str]  # (workload key, thread group)


@dataclass(frozen=True)
class GroupDemand:
    """What one thread group used: p95 of its threads' CPUs together, over `samples` samples."""

    cpus: float
    samples: int
    history_s: float
    starved: bool = False  # some of its threads were starved often: at least what they got counts

    def describe(self) -> str:
        return (f"measured p95 {self.cpus:.2f} CPUs over {self.samples} samples ({self.history_s:.0f} s)"
                + (", starved threads counted at what they got" if self.starved else ""))


@dataclass(frozen=True)
class Sizing:
    """The planner's measured input: each group's demand, the size each group was given by the
    previous plan (whether or not it fitted the host), for hysteresis, and how many member
    threads each group has now (a pool that fills its cores gets one more)."""

    demand: Mapping[GroupKey, GroupDemand]
    held: Mapping[GroupKey, int]
    threads: Mapping[GroupKey, int] = field(default_factory=dict)

    def sizes(self) -> Dict[GroupKey, int]:
        """The size of every group whose measurement counts: the next plan's `held`, and what a
        replan is due for when it changes."""
        return {key: size for key in self.demand for size in (self.cores(key)[0],) if size is not None}

    def cores(self, key: GroupKey) -> Tuple[Optional[int], str]:
        """(whole cores the measurement asks for, why); (None, why) where it does not count yet."""
        demand = self.demand.get(key)
        if demand is None:
            return None, "no usage measured yet"
        if demand.samples < MIN_SAMPLES:
            return None, f"{demand.samples} of {MIN_SAMPLES} samples measured so far"
        threads = self.threads.get(key)
        why = demand.describe()
        if fills_its_cores(demand.cpus, threads):
            why += f"; {threads} threads would fill {_whole_cores(demand.cpus)} whole core(s) and queue there, so one more"
        return resize(demand.cpus, self.held.get(key), threads), why


NO_SIZING = Sizing({}, {})


def sized_workloads(workloads: Sequence[Any], profiles: Mapping[str, Any]) -> List[Any]:
    """The workloads that measurement sizes: those whose profile has an exclusive group. The
    others' use is watched but sizes nothing, and a fork storm's hundreds of workloads replan ten
    times a second."""
    sized = {name for name, profile in profiles.items()
             if any(group.treatment == EXCLUSIVE for group in profile.thread_groups)}
    return [w for w in workloads if w.profile_id in sized] if sized else []


def member_counts(workloads: Sequence[Any], keys: Iterable[GroupKey]) -> Dict[GroupKey, int]:
    """How many member threads each of these groups has in these (matched) workloads now."""
    by_key = {w.key: w for w in workloads}
    return {(key, group): len(by_key[key].members(group)) for key, group in keys if key in by_key}


def cores_for(cpus: float, threads: Optional[int] = None) -> int:
    """Whole cores for a demand: 1.8 -> 2, 2.03 -> 2 (within GROW_TOLERANCE), 2.2 -> 3; one more
    for a pool of `threads` that would fill them (fills_its_cores)."""
    cores = _whole_cores(cpus)
    return cores + 1 if fills_its_cores(cpus, threads) else cores


def fills_its_cores(cpus: float, threads: Optional[int]) -> bool:
    """A pool of more threads than the cores its demand asks for, using POOL_FULL of them or more."""
    cores = _whole_cores(cpus)
    return threads is not None and threads > cores and cpus >= cores * POOL_FULL


def _whole_cores(cpus: float) -> int:
    return max(1, math.ceil(round(cpus - GROW_TOLERANCE, 6)))


def resize(cpus: float, held: Optional[int], threads: Optional[int] = None) -> int:
    """The size for this demand given the size held now (None: none held) and the group's
    member threads (None: not known; no pool rule)."""
    wanted = cores_for(cpus, threads)
    if held is None or wanted >= held:
        return wanted
    # Shrink one step at a time, and only while the smaller size keeps its headroom.
    size = held
    while size > wanted and cpus <= (size - 1) * SHRINK_BUSY:
        size -= 1
    return size


def group_demands(summary) -> Dict[str, GroupDemand]:
    """Per thread group, from a usage_history UsageSummary: the larger of its individually kept
    threads' p95 summed (a sum of p95s: at or above the p95 of the sum) and the p95 of what its
    threads that were not hot used together (which covers the threads not kept individually).
    The two are not added: a thread that turned hot is in both, its cooler samples in the second.

    A thread starved in more than STARVED_SHARE_MAY_BE_HOT of the samples (runnable all along on
    CPUs with none to spare: its p95 leaves those intervals out) counts at least what it got in
    them. Two ONNX Runtime threads spinning on the one core of `cpus = 1.0` were starved in every
    sample and measured at 0.05 CPUs, which kept them there."""
    kept: Dict[str, float] = {}
    starved = set()
    for thread in summary.threads:
        if thread.group is not None:
            often = thread.starved_samples > STARVED_SHARE_MAY_BE_HOT * max(1, summary.samples)
            if often and thread.starved_got > thread.p95:
                starved.add(thread.group)
            kept[thread.group] = kept.get(thread.group, 0.0) + max(thread.p95, thread.starved_got if often else 0.0)
    groups = set(kept) | set(summary.group_rest_p95)
    return {group: GroupDemand(round(max(kept.get(group, 0.0), summary.group_rest_p95.get(group, 0.0)), 3),
                               summary.samples, summary.history_s, group in starved) for group in groups}
