"""Which profile and tier apply to each process, and which thread group each thread is in — and why.

Precedence: a runtime binding (`temperctl bind --pid P --profile FILE`: the process and its
descendants, until unbound or the process ends), then TEMPER_WORKLOAD_PROFILE=<id> in the process
environment, then a [[binding]] naming its unit or cgroup, then profile fingerprints (executable, unit, cgroup,
process name, command line). Processes of one workload (one unit, or one process tree
without a unit) are matched together so a process-per-connection server is one workload.

A match raises standing (exclusive and latency groups, the critical tier) only for processes
the host trusts (decide/trust.py); for others it only lowers it.

A Matcher reads nothing of the host itself: a match is made of the facts (`ProcessFacts`: what
an environment binding or a budget needs is read on demand by the facts themselves, once per
program image), the configuration and the trust policy (hostview builds it from the host's
accounts; a Matcher made without one builds it the same way). It is not a pure function: it
keeps, from one match to the next, the runtime bindings, what it last decided of each process and
the workloads it last built (a batch of process events decides again only the processes it
changed), and each thread's runtime at the last match (a `busiest` group ranks by the CPU grown
since).
"""

from __future__ import annotations

import bisect
import dataclasses
import fnmatch
import functools
import hashlib
import hmac
import logging
import operator
import os
import re
from dataclasses import dataclass, field
from typing import Any, Collection, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from temperd.config.daemon_config import Binding, DaemonConfig
from temperd.config.profile import Profile, ThreadGroup
from temperd.config.schema import glob_match
from temperd.config import safe_regex
from temperd.decide.grouping import Grouping
from temperd.decide.trust import RAISING_TIERS, RAISING_TREATMENTS, UNTRUSTED_TIER_CAP, TrustPolicy, trust_policy
from temperd.sources.facts import ProcessFacts

log = logging.getLogger(__name__)

ENV_PROFILE = "TEMPER_WORKLOAD_PROFILE"
_TID, _PID = operator.attrgetter("tid"), operator.attrgetter("pid")


@dataclass(frozen=True)
class RuntimeBinding:
    """A profile bound to one process (pid, start time) at run time, over the control socket.
    Its profile's id is made unique to the process, so it never replaces a loaded profile."""

    pid: int
    start_time: int
    profile: Profile
    tier: Optional[str]
    requester: str

    @staticmethod
    def bound_id(profile_id: str, pid: int) -> str:
        return f"{profile_id}-bound-{pid}"


@dataclass(frozen=True)
class ThreadMatch:
    tid: int
    pid: int
    comm: str
    group: Optional[str]  # None: in no group of the profile (untreated)
    reason: str


@dataclass(frozen=True)
class Workload:
    key: str  # unit name, or "<profile>:pid<root pid>" for a process tree without a unit
    profile_id: Optional[str]
    tier: str
    budget: Optional[float]  # CPUs
    budget_reason: str
    source: str  # "bind" | "env" | "binding" | "fingerprint"
    reason: str
    unit: Optional[str]
    cgroup: Optional[str]
    pids: Tuple[int, ...]
    threads: Tuple[ThreadMatch, ...]
    # What tells two hand-started instances of one profile apart: its root process's program and
    # a digest of its command line (_instance), never the command line itself.
    instance: str = ""

    def members(self, group: str) -> Tuple[int, ...]:
        return self._members_by_group.get(group, ())

    @functools.cached_property
    def _members_by_group(self) -> Dict[Optional[str], Tuple[int, ...]]:
        """Once per workload: a match reuses an unchanged workload, and every replan's plan and
        journal ask for its groups' members."""
        out: Dict[Optional[str], List[int]] = {}
        for thread in self.threads:
            out.setdefault(thread.group, []).append(thread.tid)
        return {group: tuple(tids) for group, tids in out.items()}


@dataclass
class MatchResult:
    workloads: List[Workload] = field(default_factory=list)
    # What differs from the match before (whose workloads list `since` is; None: unknown): the
    # workloads built again (some may be the very objects they were) and the keys that ended.
    # plan_delta reads them instead of comparing every workload.
    since: Optional[List[Workload]] = field(default=None, compare=False, repr=False)
    updated: Tuple[Workload, ...] = field(default=(), compare=False, repr=False)
    ended: Tuple[str, ...] = field(default=(), compare=False, repr=False)

    def workload_of(self, pid: int) -> Optional[Workload]:
        for workload in self.workloads:
            if pid in workload.pids:
                return workload
        return None


@dataclass(frozen=True)
class _BuiltWorkload:
    """A workload as the last match built it, and what it was built from: the next match reuses
    it while these are equal (a foreign process event must not rebuild a 2 000-thread workload)."""

    inputs: tuple  # (processes, decision, budget, distrust)
    workload: "Workload"
    runtimes: Mapping[Tuple[int, int], int]  # (tid, start time) -> runtime, as _assign saw it


@dataclass(frozen=True)
class _ProcessDecision:
    profile: Optional[Profile]
    tier: str
    source: str
    reason: str
    binding: Optional[Binding]
    distrust: Optional[str] = None  # why a match may not raise this process; None: it may


def _cmdline_text(proc) -> str:
    return " ".join(proc.cmdline or ())


@functools.lru_cache(maxsize=1024)
def any_glob(patterns: Tuple[str, ...]) -> Optional["re.Pattern[str]"]:
    """One expression that matches what any of these shell patterns matches (fnmatchcase's
    translation): a new process is checked against every loaded profile, and most reject it."""
    if not patterns:
        return None
    return re.compile("|".join(f"(?:{fnmatch.translate(pattern)})" for pattern in patterns))


def _first_glob(patterns: Tuple[str, ...], text: str) -> Optional[str]:
    """The first of these patterns that matches text, or None."""
    union = any_glob(patterns)
    if union is None or not union.match(text):
        return None
    return next(pattern for pattern in patterns if glob_match(pattern, text))


def fingerprint_reason(profile: Profile, proc) -> Optional[str]:
    """Why the process matches the profile's fingerprint, or None."""
    fp = profile.fingerprint
    exe = proc.exe or ""
    pattern = _first_glob(fp.executables, exe) if exe else None
    if pattern is not None:
        return f"executable {exe} matches {pattern!r}"
    pattern = _first_glob(fp.units, proc.unit) if proc.unit else None
    if pattern is not None:
        return f"unit {proc.unit} matches {pattern!r}"
    for prefix in fp.cgroups:
        if cgroup_under(proc.cgroup, prefix):
            return f"cgroup {proc.cgroup} is under {prefix}"
    pattern = _first_glob(fp.process_names, proc.name)
    if pattern is not None:
        return f"process name {proc.name!r} matches {pattern!r}"
    text = _cmdline_text(proc)
    for pattern in fp.cmdline:
        if text and safe_regex.search(pattern, text):
            return f"command line matches {pattern!r}"
    return None


def cgroup_under(path: Optional[str], prefix: str) -> bool:
    """Whether a cgroup path is the prefix's cgroup or below it (a whole path component)."""
    return bool(path) and (path == prefix or path.startswith(prefix.rstrip("/") + "/"))  # type: ignore[union-attr]


def binding_for(config: DaemonConfig, proc) -> Optional[Binding]:
    for binding in config.bindings:
        if binding.unit and proc.unit and glob_match(binding.unit, proc.unit):
            return binding
        if binding.cgroup and cgroup_under(proc.cgroup, binding.cgroup):
            return binding
    return None


class Matcher:
    def __init__(self, config: DaemonConfig, profiles: Mapping[str, Profile], *,
                 trust: Optional[TrustPolicy] = None, label_key: bytes = b""):
        self.config = config
        self.label_key = label_key  # keys the digest in a hand-started workload's label
        self.trust = trust if trust is not None else trust_policy(config)
        self.profiles = dict(profiles)
        self._ordered = [self.profiles[k] for k in sorted(self.profiles)]
        self._decisions: Dict[tuple, Optional[_ProcessDecision]] = {}
        self._decided: Dict[int, tuple] = {}  # pid -> (the facts, their binding, the decision) last decided
        self._last_runtime: Dict[Tuple[int, int], int] = {}
        self._built: Dict[str, _BuiltWorkload] = {}  # workload key -> the workload last built for it
        self._grouping = Grouping()
        self._workloads: Dict[str, Workload] = {}  # workload key -> the last match's workload
        # Their keys, sorted, and the workloads in that order (None: to be made from _workloads).
        self._listed: Optional[Tuple[List[str], List[Workload]]] = ([], [])
        self._regroup = False  # the next match decides every process again
        self._selections: Dict[Tuple[int, str, str], Tuple[Profile, Optional[Tuple[str, str]]]] = {}
        self._assigned: Dict[Tuple[int, int], _Assigned] = {}  # (pid, start) -> its threads' matches, last time
        self.runtime_bindings: Dict[int, RuntimeBinding] = {}  # pid -> binding (temperctl bind)
        self._bound: Dict[int, RuntimeBinding] = {}  # pid -> the binding of it or an ancestor, this match
        self.generation: Optional[int] = None  # the inventory snapshot's the last match was made of
        self._last: Optional[List[Workload]] = None  # the last match's workloads

    def set_runtime_bindings(self, bindings: Mapping[int, RuntimeBinding]) -> None:
        self.runtime_bindings = dict(bindings)
        self._regroup = True  # decisions made under the bindings before are made again

    def runtime_profiles(self) -> Dict[str, Profile]:
        """The profiles of the runtime bindings, by their (per-process) ids: the planner's too."""
        return {b.profile.id: b.profile for b in self.runtime_bindings.values()}

    # ---- per process -----------------------------------------------------------------------

    def decide(self, proc) -> Optional[_ProcessDecision]:
        """Profile and tier of one process, or None when nothing selects it (cached: the facts
        it depends on are the key, so an exec, a new title or a cgroup move decides again)."""
        if proc.is_kernel_thread or getattr(proc, "light", False):
            return None  # light: the candidate index found that nothing can match it (decide/candidates.py)
        bound = self._bound.get(proc.pid)
        same = self._decided.get(proc.pid)
        if same is not None and same[0] is proc and same[1] is bound:
            return same[2]  # the very facts decided last time (the inventory's are immutable)
        key = (proc.pid, proc.start_time, proc.execs, proc.uid, proc.name, proc.exe, tuple(proc.cmdline or ()),
               proc.unit, proc.cgroup, bound)
        if key not in self._decisions:
            decision = self._decide(proc)
            if decision is not None:
                distrust = self.trust.distrust(proc)
                if distrust:
                    decision = dataclasses.replace(decision, distrust=distrust)
                    log.info("pid %d (%s): matched (%s), not raised: %s", proc.pid, proc.name,
                             decision.reason, distrust)
            self._decisions[key] = decision
        if isinstance(proc, ProcessFacts):
            self._decided[proc.pid] = (proc, bound, self._decisions[key])
        return self._decisions[key]

    def _decide(self, proc) -> Optional[_ProcessDecision]:
        binding = binding_for(self.config, proc)
        tier = binding.tier if binding else self.config.default_tier
        tier_reason = f"tier {tier} from {binding.describe()}" if binding else f"default tier {tier}"
        bound = self._bound.get(proc.pid)
        if bound is not None:
            tier = bound.tier or tier
            return _ProcessDecision(bound.profile, tier, "bind", f"profile {bound.profile.id} bound to pid {bound.pid} "
                                    f"by {bound.requester}; tier {tier}", binding)
        wanted = proc.environ(ENV_PROFILE)  # read once per program image (`exec env X=y prog` brings one)
        if wanted:
            profile = self.profiles.get(wanted)
            why = "in its environment" if profile else "names no loaded profile"
            return _ProcessDecision(profile, tier, "env", f"{ENV_PROFILE}={wanted} {why}; {tier_reason}", binding)
        if binding is not None:
            if binding.profile:
                profile = self.profiles.get(binding.profile)
                why = f"profile {binding.profile} from {binding.describe()}" if profile else \
                    f"{binding.describe()} names profile {binding.profile!r}, which is not loaded"
                return _ProcessDecision(profile, tier, "binding", f"{why}; {tier_reason}", binding)
        for profile in self._ordered:
            why = fingerprint_reason(profile, proc)
            if why:
                return _ProcessDecision(profile, tier, "fingerprint", f"profile {profile.id}: {why}; {tier_reason}", binding)
        if binding is not None:
            return _ProcessDecision(None, tier, "binding", f"no profile; {tier_reason}", binding)
        return None

    def explain_unmatched(self, proc) -> str:
        if proc.is_kernel_thread:
            return "kernel thread: never treated"
        exe = proc.exe or ("not readable (permission denied)" if "exe" in proc.unreadable else "-")
        return (f"no {ENV_PROFILE} in its environment, no binding for unit {proc.unit or '-'} / cgroup "
                f"{proc.cgroup or '-'}, and no fingerprint of {len(self._ordered)} loaded profiles matches "
                f"(name {proc.name!r}, exe {exe})")

    # ---- whole host ------------------------------------------------------------------------

    def match(self, processes: Iterable, generation: Optional[int] = None,
              changed: Optional[Collection[int]] = None) -> MatchResult:
        """The host's workloads. Only the workloads whose processes changed since the last match
        are built again (grouping.py); the others are the very objects it returned.
        processes: the facts, or a mapping pid -> facts (kept as it is: it must not change).
        generation: the inventory snapshot's they are (the next call's `changed` is relative to it);
        changed: the pids whose facts differ from those of `self.generation`, so that the others
        are not compared (None: every process is)."""
        procs = processes if isinstance(processes, Mapping) else {p.pid: p for p in processes}
        if self.generation is None:
            changed = None
        since, self._last, self.generation = self._last, None, None  # as they stay if this match fails
        listed, self._listed = self._listed, None  # a match that fails leaves them to be sorted anew
        if len(self._decisions) + len(self._assigned) > 4 * len(procs) + 128:  # ended processes', now and then
            live = {(p.pid, p.start_time) for p in procs.values()}
            self._decisions = {k: v for k, v in self._decisions.items() if (k[0], k[1]) in live}
            self._decided = {pid: d for pid, d in self._decided.items() if pid in procs}
            self._assigned = {k: v for k, v in self._assigned.items() if k in live}
            self._last_runtime = {k: v for k, v in self._last_runtime.items() if k[0] in procs}
        self._bound = _bound_processes(procs, self.runtime_bindings) if self.runtime_bindings else {}
        # A runtime binding reaches a process through its ancestors: every process is decided again.
        everything, self._regroup = bool(self.runtime_bindings) or self._regroup, True
        dirty = self._grouping.update(procs, self.decide, everything=everything, changed_pids=changed)
        seen_runtime: Dict[Tuple[int, int], int] = {}
        updated: List[Workload] = []
        ended: List[str] = []
        for key in dirty:
            pids = sorted(self._grouping.members.get(key, ()))
            if pids:
                self._workloads[key] = workload = self._keyed_workload(key, pids, seen_runtime)
                updated.append(workload)
            else:
                self._workloads.pop(key, None)
                self._built.pop(key, None)
                ended.append(key)
        self._regroup = False  # a match cut short by an error leaves it set: the next one starts over
        self._last_runtime.update(seen_runtime)
        self._listed = _relisted(listed, self._workloads, dirty)
        result = MatchResult(workloads=list(self._listed[1]), since=since, updated=tuple(updated), ended=tuple(ended))
        self._last, self.generation = result.workloads, generation
        return result

    def _keyed_workload(self, key: str, pids: Sequence[int], seen_runtime: Dict[Tuple[int, int], int]) -> Workload:
        """The workload of these processes; the one built last time where nothing it was built
        from changed."""
        decisions = self._grouping.decisions
        procs = [self._grouping.procs[p] for p in pids]
        decision = decisions[pids[0]]
        distrust = {p: decisions[p].distrust for p in pids}
        untrusted = next((why for why in distrust.values() if why), None)
        if untrusted and decision.tier in RAISING_TIERS:
            # one untrusted member keeps the whole workload (one cgroup weight) from the tier
            decision = dataclasses.replace(decision, tier=UNTRUSTED_TIER_CAP, reason=(
                f"{decision.reason}; tier {decision.tier} not granted, {UNTRUSTED_TIER_CAP} instead: {untrusted}"))
        budget = self._budget(decision.binding, procs[0])
        inputs = (tuple(procs), decision, budget, tuple(distrust.items()))
        before = self._built.get(key)
        if before is not None and before.inputs == inputs:
            seen_runtime.update(before.runtimes)
            return before.workload
        runtimes: Dict[Tuple[int, int], int] = {}
        workload = self._build_workload(key, procs, decision, budget, runtimes, distrust)
        seen_runtime.update(runtimes)
        if _reusable(procs, decision.profile):
            self._built[key] = _BuiltWorkload(inputs, workload, runtimes)
        else:
            self._built.pop(key, None)
        return workload

    def _build_workload(self, key: str, procs: Sequence, decision: _ProcessDecision,
                        budget: Tuple[Optional[float], str], seen_runtime: Dict[Tuple[int, int], int],
                        distrust: Mapping[int, Optional[str]]) -> Workload:
        threads: List[ThreadMatch] = []
        if decision.profile is not None:
            for proc in procs:
                threads.extend(self._assign(decision.profile, proc, seen_runtime, distrust.get(proc.pid)))
        else:
            for proc in procs:
                for thread in _threads(proc):
                    threads.append(ThreadMatch(thread.tid, proc.pid, thread.comm, None, "no profile: tier treatment only"))
        return Workload(
            key=key,
            profile_id=decision.profile.id if decision.profile else None,
            tier=decision.tier,
            budget=budget[0],
            budget_reason=budget[1],
            source=decision.source,
            reason=decision.reason,
            unit=procs[0].unit,
            cgroup=procs[0].cgroup,
            pids=tuple(map(_PID, procs)),
            threads=tuple(sorted(threads, key=_TID)),
            instance=_instance(procs, self.label_key),
        )

    @staticmethod
    def _budget(binding: Optional[Binding], proc: ProcessFacts) -> Tuple[Optional[float], str]:
        if binding is not None and binding.cpus is not None:
            return binding.cpus, f"cpus = {binding.cpus:g} from {binding.describe()}"
        quota = proc.cpu_quota()
        if quota is not None:
            return quota, f"CPU quota {quota:g} of cgroup {proc.cgroup}"
        return None, "no CPU budget: no binding sets cpus and the cgroup has no CPU quota"

    # ---- threads into groups -----------------------------------------------------------------

    def _selected(self, profile: Profile, comm: str, title: str) -> Optional[Tuple[str, str]]:
        """(group, reason) of the first group whose names or titles select a thread, or None;
        remembered, since a changed workload's unchanged threads are asked again."""
        key = (id(profile), comm, title)
        found = self._selections.get(key)
        if found is None or found[0] is not profile:
            answer = None
            for group in profile.thread_groups:
                why = selector_reason(group, comm, title)
                if why:
                    answer = (group.name, why)
                    break
            if len(self._selections) >= _SELECTED_MAX:
                self._selections.clear()
            found = self._selections[key] = (profile, answer)
        return found[1]

    def _assign(self, profile: Profile, proc, seen_runtime, distrust: Optional[str] = None) -> List[ThreadMatch]:
        """The group of each thread of proc. Without a `busiest` group a thread's group depends
        only on its name and the process's title: the matches of the process's last assignment
        are reused for threads that kept their names (a fork storm's creator has thousands of
        threads and gains a few per pass), and only the threads whose facts are not the very
        objects of last time (the inventory keeps an unchanged thread's) are looked at."""
        if any(group.busiest is not None for group in profile.thread_groups):
            return self._assign_ranked(profile, proc, seen_runtime, distrust)
        title = _cmdline_text(proc)
        key = (proc.pid, proc.start_time)
        context = (profile, title, distrust)
        before = self._assigned.get(key)
        threads = proc.threads
        if before is None or before.context != context:
            old: Mapping[int, ThreadMatch] = {}
            out: Dict[int, ThreadMatch] = {}
            looked_at = _threads(proc)
        elif isinstance(threads, Mapping) and isinstance(before.threads, Mapping):
            old = before.matches
            out = dict(old)
            for tid in old.keys() - threads.keys():
                del out[tid]
            looked_at = _fresh(threads, before.threads)
        else:
            old, out, looked_at = before.matches, {}, _threads(proc)
        catch_all = next((g for g in profile.thread_groups if g.catch_all), None)
        for thread in looked_at:
            match = old.get(thread.tid)
            if match is None or match.comm != thread.comm:
                selected = self._selected(profile, thread.comm, title)
                match = (ThreadMatch(thread.tid, proc.pid, thread.comm, *selected) if selected is not None
                         else _unclaimed(profile, proc.pid, thread, catch_all))
                if distrust:
                    match = _distrusted(profile, match, distrust)
            out[thread.tid] = match
        self._assigned[key] = _Assigned(context, out, threads)
        return list(out.values())

    def _assign_ranked(self, profile: Profile, proc, seen_runtime, distrust: Optional[str]) -> List[ThreadMatch]:
        """_assign for a profile with a `busiest` group: ranked by the runtime grown since the last match."""
        threads = _threads(proc)
        title = _cmdline_text(proc)
        out: Dict[int, ThreadMatch] = {}
        for thread in threads:
            selected = self._selected(profile, thread.comm, title)
            if selected is not None:
                out[thread.tid] = ThreadMatch(thread.tid, proc.pid, thread.comm, *selected)
        # "Busiest" is by recent runtime: the growth since the previous match, else the total.
        recent = {}
        for thread in threads:
            key = (thread.tid, thread.start_time)
            total = thread.runtime_ns or 0  # None: not read yet
            seen_runtime[key] = total
            recent[thread.tid] = total - self._last_runtime.get(key, 0)
        for group in profile.thread_groups:
            if group.busiest is None:
                continue
            rest = [t for t in threads if t.tid not in out]
            rest.sort(key=lambda t: (-recent[t.tid], t.tid))
            for rank, thread in enumerate(rest[: group.busiest], start=1):
                out[thread.tid] = ThreadMatch(thread.tid, proc.pid, thread.comm, group.name,
                                              f"busiest #{rank} of {group.busiest} in its process "
                                              f"({recent[thread.tid] / 1e6:.1f} ms recent CPU)")
        catch_all = next((g for g in profile.thread_groups if g.catch_all), None)
        for thread in threads:
            if thread.tid not in out:
                out[thread.tid] = _unclaimed(profile, proc.pid, thread, catch_all)
        if distrust:
            return [_distrusted(profile, match, distrust) for match in out.values()]
        return list(out.values())


@dataclass(frozen=True)
class _Assigned:
    context: Tuple[Profile, str, Optional[str]]  # the profile, the title and the distrust they were made under
    matches: Mapping[int, ThreadMatch]  # tid -> its match
    threads: object  # the process's threads they were made of


def _fresh(now: Mapping[int, Any], before: Mapping[int, Any]) -> List:
    """The threads of `now` that are not the very objects `before` has for their tids: new or changed."""
    return [thread for tid, thread in now.items() if before.get(tid) is not thread]


def _unclaimed(profile: Profile, pid: int, thread, catch_all: Optional[ThreadGroup]) -> ThreadMatch:
    """The match of a thread no group selects: the catch-all's, else none."""
    if catch_all is not None:
        return ThreadMatch(thread.tid, pid, thread.comm, catch_all.name,
                           f"no other group of {profile.id} claims it: catch-all {catch_all.name}")
    return ThreadMatch(thread.tid, pid, thread.comm, None,
                       f"no group of {profile.id} selects it and the profile has no catch-all")


def _distrusted(profile: Profile, match: ThreadMatch, distrust: str) -> ThreadMatch:
    """A match of an untrusted process: out of a group whose treatment would raise its standing."""
    treatment = next(g.treatment for g in profile.thread_groups if g.name == match.group) if match.group else None
    if treatment not in RAISING_TREATMENTS:
        return match
    return ThreadMatch(match.tid, match.pid, match.comm, None, f"{match.reason}; {treatment} not granted: {distrust}")


def _instance(procs: Sequence, key: bytes) -> str:
    """What tells hand-started instances of one profile apart, without their command line (any
    local user reads a label on /metrics, and an argument may be a password): the program of the
    root process (the one whose parent is not in it: its executable's name, else its own) and a
    digest of its command line keyed with the host's secret (config/label_key.py: an unkeyed one
    would let a reader test guesses of an argument), the same while it runs and across restarts."""
    root = _root(procs)
    return _instance_label(key, root.exe, root.name, tuple(root.cmdline))


def _root(procs: Sequence):
    """The first process whose parent is not one of them (else the first); at once for the
    one-process workload that most are."""
    if len(procs) == 1:
        return procs[0]
    pids = {p.pid for p in procs}
    return next((p for p in procs if p.ppid not in pids), procs[0])


@functools.lru_cache(maxsize=1024)
def _instance_label(key: bytes, exe: Optional[str], name: str, cmdline: Tuple[str, ...]) -> str:
    """_instance's label of a root process: a workload built again each pass (its threads come
    and go) keeps its root, and hand-started instances of one program share a command line."""
    text = "\0".join(cmdline).encode("utf-8", "surrogateescape")
    digest = hmac.new(key, text, hashlib.sha256).hexdigest()[:8]
    return f"{os.path.basename(exe) if exe else name} {digest}"


_SELECTED_MAX = 8192  # remembered (profile, name, title) answers; forgotten all at once beyond


def _reusable(procs: Sequence, profile: Optional[Profile]) -> bool:
    """Whether a workload may be reused while its inputs compare equal: its processes are the
    inventory's immutable facts (an object changed in place would compare equal to itself), and
    no `busiest` group ranks threads by the runtime grown since the previous match."""
    if profile is not None and any(group.busiest is not None for group in profile.thread_groups):
        return False
    return all(isinstance(proc, ProcessFacts) for proc in procs)


def _relisted(listed: Optional[Tuple[List[str], List[Workload]]], workloads: Mapping[str, Workload],
              dirty: Collection[str]) -> Tuple[List[str], List[Workload]]:
    """The keys of `workloads`, sorted, and their workloads in that order: `listed` (which the
    caller gives up) with only the dirty keys' entries placed, taken out or replaced."""
    if listed is None or 4 * len(dirty) > len(workloads):
        keys = sorted(workloads)
        return keys, list(map(workloads.__getitem__, keys))
    keys, ordered = listed
    for key in dirty:
        at = bisect.bisect_left(keys, key)
        there = at < len(keys) and keys[at] == key
        workload = workloads.get(key)
        if workload is None:
            if there:
                del keys[at], ordered[at]
        elif there:
            ordered[at] = workload
        else:
            keys.insert(at, key)
            ordered.insert(at, workload)
    return keys, ordered


def _bound_processes(procs: Mapping[int, object], bindings: Mapping[int, RuntimeBinding]) -> Dict[int, RuntimeBinding]:
    """pid -> the runtime binding of the process itself or of its nearest bound ancestor; a
    binding whose process is gone (or whose pid now names another process) binds nothing."""
    live = {pid: b for pid, b in bindings.items() if pid in procs and procs[pid].start_time == b.start_time}
    out: Dict[int, RuntimeBinding] = {}
    for pid in procs:
        seen = set()
        ancestor = pid
        while ancestor in procs and ancestor not in seen:
            if ancestor in live:
                out[pid] = live[ancestor]
                break
            seen.add(ancestor)
            ancestor = procs[ancestor].ppid
    return out


def _threads(proc) -> List:
    threads = proc.threads
    return list(threads.values()) if isinstance(threads, Mapping) else list(threads)


def selector_reason(group: ThreadGroup, comm: str, title: str) -> Optional[str]:
    for pattern in group.thread_names:
        if glob_match(pattern, comm):
            return f"thread name {comm!r} matches {pattern!r} of group {group.name}"
    for pattern in group.process_titles:
        if title and safe_regex.search(pattern, title):
            return f"process title matches {pattern!r} of group {group.name}"
    return None
