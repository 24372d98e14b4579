"""Wiring of the decide stage: configuration + profiles + machine shape + processes -> match and plan.

The daemon and `temperctl plan --dry-run` / `explain` go through the same functions, so what the
CLI shows is what the daemon would do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Collection, Dict, Iterable, List, Optional, Sequence, Tuple

from temperd.config.daemon_config import (DEFAULT_CONFIG_DIR, DaemonConfig, check_binding_profiles, load_config)
from temperd.config.errors import ConfigProblem
from temperd.decide.trust import trust_policy
from temperd.decide.matcher import Matcher, MatchResult, Workload
from temperd.plan import LayerPlan
from temperd.decide.plan_delta import plan_delta
from temperd.decide.planner import PlanMemo, PlannerSettings, plan
from temperd.decide.sizing import NO_SIZING, Sizing
from temperd.config.profile import Profile
from temperd.config.profileset import HostShape, ProfileSet, load_profile_set
from temperd.sources.shape import SYSFS_ROOT, MachineShape, read_shape


@dataclass(frozen=True)
class HostView:
    """What the decide stage reads besides the processes: one consistent generation."""

    config: DaemonConfig
    shape: MachineShape
    profiles: ProfileSet

    @property
    def problems(self) -> List[ConfigProblem]:
        return list(self.profiles.problems) + check_binding_profiles(self.config, self.profiles.active)


def load_host_view(config_dir: str = DEFAULT_CONFIG_DIR, sysfs_root: str = SYSFS_ROOT, *,
                   require_trusted: bool = True) -> HostView:
    """Raises ConfigError for a bad temperd.toml; bad profile files are listed in .problems."""
    config = load_config(config_dir, require_trusted)
    shape = read_shape(sysfs_root)
    profiles = load_profile_set(HostShape.of(shape), config.profile_dir, require_trusted=require_trusted)
    return HostView(config, shape, profiles)


def make_matcher(view: HostView, label_key: bytes = b"") -> Matcher:
    """label_key: the host's (config/label_key.py), which only the daemon reads; without it a
    hand-started workload's label digest differs from the daemon's."""
    return Matcher(view.config, view.profiles.active, trust=trust_policy(view.config), label_key=label_key)


def planner_settings(config: DaemonConfig) -> PlannerSettings:
    return PlannerSettings(reserve_cpus=config.reserve_cpus,
                           tier_weights=tuple(sorted(config.tier_weights.items())),
                           idle_resume_us=tuple(sorted(config.tier_idle_resume_us.items())))


def decide(view: HostView, matcher: Matcher, processes: Iterable,
           sizing: Callable[[Sequence[Workload]], Sizing] = lambda workloads: NO_SIZING,
           memo: Optional[PlanMemo] = None, previous: Optional[LayerPlan] = None,
           generation: Optional[int] = None, changed: Optional[Collection[int]] = None) -> Tuple[MatchResult, LayerPlan]:
    """sizing(workloads): what the matched workloads' exclusive groups were measured to use.
    memo: the daemon's, kept from one replan to the next (one per matcher: a reload makes both anew).
    previous: the plan in force, made from this matcher's last match, where only the workloads
    that match changed are to be planned again (plan_delta; the whole plan where it declines:
    then sizing is asked). generation, changed: the inventory snapshot's generation and the
    pids changed since the matcher's last match (Matcher.match)."""
    match = matcher.match(processes, generation, changed)
    profiles, settings = all_profiles(view, matcher), planner_settings(view.config)
    if previous is not None:
        delta = plan_delta(previous, match, profiles, settings)
        if delta is not None:
            return match, delta
    return match, plan(view.shape, match.workloads, profiles, settings, sizing(match.workloads), memo)


def all_profiles(view: HostView, matcher: Matcher) -> Dict[str, Profile]:
    """The profiles a plan is made of: the host's and the runtime bindings' (per process)."""
    return {**view.profiles.active, **matcher.runtime_profiles()}
