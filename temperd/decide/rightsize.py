"""How much CPU does a workload really need, counted per thread: a pure function from the
per-thread usage history (observe/usage_history.py) and what is declared for the workload.

needed = exclusive cores (one per thread whose p95 is >= HOT_THREAD_CPUS of a core: throttling it
is a latency incident, so it gets a core of its own) + the shared remainder (p95 of the sum of
every other thread, x (1 + margin)), never more than the CPUs it may run on (the host's, or its
cpuset's). A thread's p95 counts only intervals in which it was not starved (observe/
usage_tracker.demand): a thread starved in more than 5 % of its intervals (its p95 then unknown)
wanted at least what it got and at most a whole CPU then; it gets a core where such threads fit
beside the rest, else what they got counts as shared and the recommendation says it was starved,
for how long, and what it got. Not so a thread behind on its own pace: starved in a minority of
its intervals and getting no more then than it uses unhindered allows for catching up (fixed work
per period on a crowded host); its measured p95 stands.

Beside it the per-container figure a container-average rightsizer gives (p90 of the whole
workload x (1 + margin), as the Kubernetes VPA recommender), which cannot see a hot thread.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Mapping, Optional, Tuple

from temperd.decide.classify import HOT_THREAD_CPUS, InputBound

CONFIDENT_HISTORY_S = 24 * 3600.0  # a day of history: full confidence
STARVED_SHARE_MAY_BE_HOT = 0.05  # starved in more of its intervals than this, its p95 is unknown
MOSTLY_STARVED = 0.5  # starved in more of its intervals than this, its measured p95 says little
CATCH_UP_MARGIN_CPUS = 0.05
CONFIDENCE_UNIT_S = 60.0


@dataclass(frozen=True)
class ThreadUsage:
    """One thread kept individually in the history."""

    tid: int
    comm: str
    group: Optional[str]
    p50: float  # CPUs (1.0 = a whole core), over the intervals in which it was not starved
    p95: float
    measured: bool = True  # p50 and p95 rest on intervals in which it was not starved (else they are 0)
    starved_samples: int = 0  # intervals in which it was starved
    starved_got: float = 0.0  # CPUs it got in them, on average


@dataclass(frozen=True)
class UsageSummary:
    """A workload's usage history, summarised."""

    workload: str
    threads: Tuple[ThreadUsage, ...]  # the busiest threads, kept individually
    rest_p95: float  # p95 of the per-sample sum of every thread that was not hot
    total_p50: float  # the whole workload, as a container-average rightsizer sees it
    total_p90: float
    total_p95: float
    history_s: float  # first to last sample
    samples: int
    group_rest_p95: Mapping[str, float] = field(default_factory=dict)  # the same per thread group
    starved_samples: int = 0  # intervals in which one of its kept threads was starved
    starved_got_p95: float = 0.0  # what the whole workload got in those intervals


@dataclass(frozen=True)
class Declared:
    """What the workload is given: its CPU budget and where it is declared, how often its quota
    throttled it, and the exclusive cores temperd's plan gives it."""

    cpus: Optional[float]  # None: nothing declared (it may use the whole host)
    source: str  # "cgroup cpu.max (CPUQuota=)", "binding[0] cpus", "cpuset 0-1 (AllowedCPUs=)", ...
    host_cpus: int  # the CPUs it may run on: the host's, or its cgroup's cpuset's
    throttled: Optional[Tuple[int, int, float]] = None  # (periods, nr_throttled, seconds), since the cgroup began
    granted_exclusive_cores: int = 0


@dataclass(frozen=True)
class Recommendation:
    workload: str
    declared_cpus: Optional[float]
    needed_cpus: float
    exclusive_cores: int
    shared_cpus: float
    hot_threads: Tuple[Dict[str, object], ...]
    savings_cpus: Optional[float]  # declared - needed; negative: it needs more than it has
    risk: Optional[str]  # None, or why the declared budget is short of what it needs
    confidence: float
    reason: str
    per_container_cpus: float  # the container-average view (p90 x (1 + margin)), for contrast
    groups: Tuple[Dict[str, object], ...] = ()
    profile: Optional[str] = None  # the profile it matched, named beside its label
    input_bound: Optional[Dict[str, object]] = None  # its GPU waits for its input workers (classify.InputBound)
    starved_s: Optional[float] = None  # how long it was starved (None: never), and what it got then
    starved_got_cpus: Optional[float] = None

    def as_json(self) -> Dict[str, object]:
        return asdict(self)


def history_confidence(history_s: float) -> float:
    """0 without history, 1 from a day on, growing with the logarithm of its length (a minute:
    0.1, an hour: 0.56)."""
    if history_s <= 0:
        return 0.0
    ratio = math.log1p(history_s / CONFIDENCE_UNIT_S) / math.log1p(CONFIDENT_HISTORY_S / CONFIDENCE_UNIT_S)
    return round(min(1.0, ratio), 2)


def _cpus(value: float) -> float:
    return round(value, 2)


def behind_on_its_own_pace(t: ThreadUsage, samples: int) -> bool:
    """Starved in a minority of its intervals, and getting no more then than its own pace allows
    for catching up (twice its p95 where it was not starved, plus a margin): a thread with fixed
    work per period that fell behind now and then on a crowded host. Its measured p95 is its
    demand; a burst that found its CPUs busy gets far more than its quiet p95 when starved."""
    return (t.measured and t.p95 < HOT_THREAD_CPUS and t.starved_samples <= MOSTLY_STARVED * samples
            and t.starved_got <= 2 * t.p95 + CATCH_UP_MARGIN_CPUS)


def _may_be_hot(t: ThreadUsage, samples: int) -> bool:
    samples = max(1, samples)
    return t.starved_samples > STARVED_SHARE_MAY_BE_HOT * samples and not behind_on_its_own_pace(t, samples)


def rightsize(usage: UsageSummary, declared: Declared, margin: float, profile: Optional[str] = None,
              input_bound: Optional[InputBound] = None) -> Recommendation:
    """The recommendation for one workload (module docstring). Savings: declared - needed where
    something is declared; risk where declared < needed, with the throttling counted so far.
    input_bound: its GPU waits for its input workers (from its classification): said first."""
    capacity = float(declared.host_cpus)  # no recommendation names more CPUs than it may run on
    hot = sorted((t for t in usage.threads if t.measured and t.p95 >= HOT_THREAD_CPUS), key=lambda t: (-t.p95, t.tid))
    # Threads starved in more than the p95's 5 % of the intervals may be hot: in those intervals
    # they wanted at least what they got and at most a whole CPU (a spinner on a crowded host, a
    # burst that found its CPUs busy, or a thread behind on fixed work). A core each where they fit
    # beside the rest; else the starvation is the whole workload's and no thread can be told hot.
    hungry = sorted((t for t in usage.threads if t not in hot and _may_be_hot(t, usage.samples)), key=lambda t: t.tid)
    fits = bool(hungry) and len(hot) + len(hungry) <= capacity - (1 if usage.rest_p95 > 0 else 0)
    cored = hot + (hungry if fits else [])
    exclusive = len(cored)
    got = sum(t.starved_got for t in hungry) if not fits else 0.0  # their CPUs, shared, as a lower bound
    shared = _cpus((usage.rest_p95 + got) * (1 + margin))
    needed = _cpus(min(capacity, exclusive + shared))
    per_container = _cpus(min(capacity, usage.total_p90 * (1 + margin)))
    starved_s = usage.starved_samples * usage.history_s / max(1, usage.samples)
    savings = _cpus(declared.cpus - needed) if declared.cpus is not None else None
    risk = None
    if declared.cpus is not None and declared.cpus < needed:
        risk = f"declared {declared.cpus:g} CPUs < needed {needed:g}"
        if declared.throttled is not None:
            periods, throttled, seconds = declared.throttled
            risk += f": throttled in {throttled} of {periods} periods (nr_throttled), {seconds:.1f} s"
        if exclusive:
            risk += f"; its {exclusive} hot thread(s) stall while the quota is spent"
    parts: List[str] = [input_bound.text] if input_bound is not None else []
    if usage.starved_samples:
        parts.append(f"starved {starved_s:.0f} s of {usage.history_s:.0f} s (runnable and kept waiting while the "
                     f"host had no CPU to spare): got p95 {usage.starved_got_p95:.2f} CPUs then; what it wanted is "
                     f"estimated from the other intervals and bounded by the {capacity:g} CPUs it may use")
    for t in hot:
        parts.append(f"thread {t.comm!r} (tid {t.tid}{', group ' + t.group if t.group else ''}) p95 {t.p95:.2f} CPU "
                     f">= {HOT_THREAD_CPUS}: a core of its own")
    for t in hungry:
        verdict = ("a core of its own (at least what it got, at most a whole CPU, and it fits)" if fits else
                   f"no core of its own: {len(hot) + len(hungry)} such threads do not fit the {capacity:g} CPUs")
        parts.append(f"thread {t.comm!r} (tid {t.tid}) starved in {t.starved_samples} of {usage.samples} intervals, "
                     f"got {t.starved_got:.2f} CPU then: {verdict}")
    others = len(usage.threads) - exclusive
    parts.append(f"the other threads ({others} kept individually, the rest aggregated) p95 {usage.rest_p95:.2f} CPU"
                 + (f" + {got:.2f} CPU the starved ones got" if got else "") + f" x (1 + {margin:g}) = {shared:g} shared")
    if exclusive + shared > capacity:
        parts.append(f"needed {exclusive + shared:.2f} capped at the {capacity:g} CPUs it may use")
    if declared.cpus is not None:
        parts.append(f"declared {declared.cpus:g} CPUs ({declared.source})")
    else:
        parts.append(f"nothing declared ({declared.source}; the host has {declared.host_cpus} CPUs)")
    if declared.granted_exclusive_cores:
        parts.append(f"temperd gives it {declared.granted_exclusive_cores} exclusive core(s)")
    parts.append(f"per-container view p90 {usage.total_p90:.2f} x (1 + {margin:g}) = {per_container:g} shared CPUs"
                 + (", hot thread without a core of its own" if exclusive else ""))
    parts.append(f"history {usage.history_s:.0f} s, {usage.samples} samples")
    groups = tuple({"group": group, "exclusive_cores": sum(1 for t in cored if (t.group or "-") == group),
                    "shared_cpus": _cpus(p95 * (1 + margin))}
                   for group, p95 in sorted(usage.group_rest_p95.items()))
    return Recommendation(
        workload=usage.workload, declared_cpus=declared.cpus, needed_cpus=needed, exclusive_cores=exclusive,
        shared_cpus=shared,
        hot_threads=tuple({"tid": t.tid, "comm": t.comm, "group": t.group,
                           "p95_cpus": _cpus(t.p95) if t.measured else None,
                           "p50_cpus": _cpus(t.p50) if t.measured else None,
                           "starved_got_cpus": _cpus(t.starved_got) if t.starved_samples else None} for t in cored),
        savings_cpus=savings, risk=risk, confidence=history_confidence(usage.history_s), reason="; ".join(parts),
        per_container_cpus=per_container, groups=groups, profile=profile,
        input_bound=input_bound.as_json() if input_bound is not None else None,
        starved_s=round(starved_s, 1) if usage.starved_samples else None,
        starved_got_cpus=_cpus(usage.starved_got_p95) if usage.starved_samples else None)
