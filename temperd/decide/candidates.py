"""The candidate index: what any loaded profile, binding or runtime binding could match, compiled
once per reload, so that the inventory turns down a process none can match with the fewest reads
(sources/light.py) and never reads its threads, plans or applies for it.

A process is a candidate when one of these could select it, checked cheapest first, each fact
read only when some profile or binding needs it:
  - its name (the leader's comm: in the stat the inventory reads anyway) against every
    profile's process_names;
  - its executable (one readlink) against every profile's executables, where any profile has some;
  - its cgroup (inherited from a known parent without a read) against the units and cgroup
    prefixes of every profile and [[binding]], where any has some;
  - its command line (one read) against every profile's cmdline expressions, where any has some
    (the builtin llama-cpp, onnx-inference and pytorch-training profiles do);
  - TEMPER_WORKLOAD_PROFILE in its environment (one read), which can name any profile: read only
    for processes of trusted owners (decide/trust.py: root, system accounts, system units,
    [trust]). An untrusted owner's match may only lower its own standing (yield, background), which
    it can do itself with nice(1) or chrt(1); reading every user's environment at every exec for
    that would cost a read per exec. So the environment marker is honoured for trusted owners.
A runtime binding (temperctl bind) names its pid; the inventory tracks descendants of tracked
processes itself (inheritance).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Collection, FrozenSet, Iterable, List, Optional, Pattern, Tuple

from temperd.config import safe_regex
from temperd.config.daemon_config import DaemonConfig
from temperd.config.profile import Profile
from temperd.decide.matcher import ENV_PROFILE, any_glob, cgroup_under
from temperd.decide.trust import TrustPolicy
from temperd.sources.facts import system_unit_of
from temperd.sources.light import Gate, Probe


_READ_WORDS = {"exe": "executable", "cgroup": "cgroup", "cmdline": "command line",
               "environ": f"{ENV_PROFILE} of trusted owners"}


def _union(globs: Iterable[str]) -> Optional[Pattern[str]]:
    """One expression for any of these shell patterns (the matcher's, over the set)."""
    return any_glob(tuple(sorted(set(globs))))


class CandidateIndex(Gate):
    def __init__(self, profiles: Collection[Profile], config: DaemonConfig, trust: TrustPolicy,
                 bound: Iterable[int] = ()):
        fps = [p.fingerprint for p in profiles]
        self._names = _union(g for fp in fps for g in fp.process_names)
        self._exes = _union(g for fp in fps for g in fp.executables)
        self._units = _union([g for fp in fps for g in fp.units] + [b.unit for b in config.bindings if b.unit])
        self._cgroups = tuple(sorted({c for fp in fps for c in fp.cgroups}
                                     | {b.cgroup for b in config.bindings if b.cgroup}))
        self._cmdlines: Tuple[str, ...] = tuple(sorted({r for fp in fps for r in fp.cmdline}))
        self._trust = trust
        self.bound: FrozenSet[int] = frozenset(bound)
        self.needs_exe = self._exes is not None
        self.needs_cgroup = self._units is not None or bool(self._cgroups)
        self.needs_cmdline = bool(self._cmdlines)
        self.needs_environ = bool(profiles)  # the marker can name any loaded profile
        self.describe = (f"{len(profiles)} profiles, {len(config.bindings)} bindings: a new program is checked by "
                         + ", ".join(["name"] + [_READ_WORDS[what] for what in self.reads()]))

    def reads(self) -> List[str]:
        """Which facts of a new program the index reads to turn it down (for tests and status)."""
        return [what for what, needed in (("exe", self.needs_exe), ("cgroup", self.needs_cgroup),
                                          ("cmdline", self.needs_cmdline), ("environ", self.needs_environ)) if needed]

    def wants_name(self, comm: str) -> bool:
        return self._names is not None and self._names.match(comm) is not None

    def wants(self, probe: Probe) -> Optional[str]:
        if probe.pid in self.bound:
            return "a runtime binding names it"
        if self.wants_name(probe.comm):
            return f"name {probe.comm!r}"
        if self._exes is not None:
            exe = probe.exe()
            if exe and self._exes.match(exe):
                return f"executable {exe}"
        if self.needs_cgroup:
            paths = probe.cgroup()
            if paths is not None:
                unit = paths.unit
                if self._units is not None and unit and self._units.match(unit):
                    return f"unit {unit}"
                if any(cgroup_under(paths.unified, prefix) for prefix in self._cgroups):
                    return f"cgroup {paths.unified}"
        if self._cmdlines:
            text = " ".join(probe.cmdline())
            if text and any(safe_regex.search(r, text) for r in self._cmdlines):
                return "command line"
        if self.needs_environ and self._trust.distrust(probe) is None and probe.environ(ENV_PROFILE):
            return f"{ENV_PROFILE} in its environment"
        return None

    def trusted(self, uid: Optional[int], unit_cgroup: Optional[str]) -> bool:
        return self._trust.distrust(SimpleNamespace(uid=uid, system_unit=system_unit_of(unit_cgroup))) is None


def candidate_index(view, matcher) -> CandidateIndex:
    """The index of a host view's active profiles and bindings, with the matcher's trust policy and
    runtime bindings."""
    return CandidateIndex(list(view.profiles.active.values()), view.config, matcher.trust,
                          matcher.runtime_bindings)
