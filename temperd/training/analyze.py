"""From what each thread did to thread groups: pure functions over WorkloadFeatures.

1. The request path. Threads woken from outside the workload but not by a timer (network
   receive, loopback clients, other processes) serve requests: the seeds. A thread joins the
   path when the path drives it (most of its wakeups come from path threads and it is busy or
   woken at CHAIN_RATE or more: I/O threads, dispatched workers, a WAL writer) or when the path
   waits on it (it wakes a path thread at CHAIN_RATE or more, at least WAITED_ON_SHARE of that
   thread's wakeups), or when it polls for work (wants POLLING_DEMAND CPUs and never slept). With
   no seed (a batch or self-driven workload) the busiest threads are the seeds.
2. Each thread's class: on the path, a thread using HOT_CPU or more is **sync compute** (its
   median burst is LONG_BURST_US or more) or **latency critical** (short bursts) and gets
   exclusive cores; below that a path thread is latency critical, or an **I/O wake chain** when it
   is not a seed and IO_D_SHARE of its sleeps are in D state (waiting on I/O), both latency; off the
   path, **sporadic / background**: yield (SCHED_BATCH, never SCHED_IDLE). An off-path thread the
   path waits on now and then (it gives a path thread, or such a thread, a share of that thread's
   wakeups: a JVM's VM Thread ending each safepoint, the GC workers that thread waits for)
   is left untreated when idle (below BUSY_CPU): yielding it frees no CPU, and at nice 19 beside
   any normal-priority work it stretches every pause a request waits through.
3. Threads are grouped by normalised name (names.name_key); a group takes the class of its
   foremost member (on the path first, then the busiest), except that a pool gets exclusive cores
   only when at least half of its members on the path are hot: a pool is treated as its typical
   member, so one handler that crossed HOT_CPU in one window does not flip the pool. Where names
   do not separate (every thread carries the process name: MariaDB 10.11, ONNX Runtime,
   PostgreSQL) the members are split by behaviour: across processes by process title
   (`process_titles`), inside one process as the N busiest (`busiest = N`: every busy thread on
   the path, a pool judged like a named one, so two connection threads that split the load 0.6 /
   0.28 in one window and 0.45 / 0.45 in the next are the same group) with the rest in the
   catch-all. A group holding an untreated thread is untreated as a whole (its selector cannot
   tell that thread apart).
4. Groups of one class and treatment are one cluster: one [[thread_groups]] of the profile;
   untreated groups are none. The yield cluster is the catch-all only when no thread is left
   untreated (it would catch those too).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from temperd.plan import EXCLUSIVE, LATENCY, YIELD
from temperd.training.features import INTERRUPT, NETWORK, OUTSIDE, ThreadFeatures, WorkloadFeatures
from temperd.training.names import name_key

SYNC_COMPUTE = "sync compute"
LATENCY_CRITICAL = "latency critical"
IO_WAKE_CHAIN = "I/O wake chain"
BACKGROUND = "sporadic / background"
UNTREATED = "none"  # no thread group: the thread keeps the scheduling it has
# A group takes its foremost member's treatment: untreated outranks yield, so that a group holding a
# thread the path waits on is not yielded.
RANK = {YIELD: 0, UNTREATED: 1, LATENCY: 2, EXCLUSIVE: 3}

SERVING_RATE = 5.0  # external wakeups/s that make a thread a request-path seed
CHAIN_RATE = 5.0  # wakeups/s along an edge that couple two threads
DRIVEN_SHARE = 0.5  # of a thread's wakeups, from path threads: the path drives it
WAITED_ON_SHARE = 0.1  # of a path thread's wakeups, by one thread: the path waits on that thread
# Of one path thread's wakeups, by one thread: too few to join the path, enough that requests wait on
# it now and then (a JVM's VM Thread: 2.6 % of a handler's; its busy report thread 0.5 %; memcached's
# LRU maintainer well under 0.1 % of a worker's).
WAITED_NOW_AND_THEN_SHARE = 0.01
WAITED_ON_EVENTS = 10  # ... and at least this many in the window: two wakeups in a 3 s window are chance
BUSY_CPU = 0.02  # CPUs: a thread below this is idle for sizing
HOT_CPU = 0.3  # CPUs: a path thread this busy gets exclusive cores
LONG_BURST_US = 200.0  # median on-CPU burst of sync compute
SELF_DRIVEN_SHARE = 0.5  # no seed: threads with this share of the busiest thread's CPU drive the workload
# CPUs wanted by a thread that never slept: it polls for work. As low as a hot thread: ONNX Runtime's
# spinning intra-op thread read 0.48 CPUs in one window (0.71-0.98 in others) beside a main thread at
# 0.99, under both this mark at 0.5 and SELF_DRIVEN_SHARE, and was yielded.
POLLING_DEMAND = 0.3
IO_D_SHARE = 0.3  # of a path thread's sleeps, in D state: it waits on I/O for the path


@dataclass
class Verdict:
    """One thread's place: on the request path or not and why, its class and treatment."""

    tid: int
    on_path: bool
    why: str
    cls: str
    treatment: str


@dataclass
class Cluster:
    name: str
    cls: str
    treatment: str
    selector: str  # thread_names | process_titles | busiest | catch_all
    patterns: Tuple[str, ...] = ()  # globs (thread_names) or regular expressions (process_titles)
    busiest: Optional[int] = None
    tids: Tuple[int, ...] = ()
    cores: int = 0  # exclusive: the whole cores its busy threads need
    note: str = ""  # why this selector, when names did not separate


@dataclass
class Analysis:
    features: WorkloadFeatures
    verdicts: Dict[int, Verdict]
    clusters: List[Cluster]
    seeds: Tuple[int, ...]
    budget: float  # CPUs the sizing is for
    budget_reason: str

    @property
    def untreated(self) -> Tuple[int, ...]:
        """Threads no group selects: they keep the scheduling they have."""
        grouped = {t for c in self.clusters for t in c.tids}
        return tuple(sorted(t for t in self.features.threads if t not in grouped))

    def cluster_of(self, tid: int) -> Optional[Cluster]:
        for cluster in self.clusters:
            if tid in cluster.tids:
                return cluster
        return None


# ---- 1. the request path -------------------------------------------------------------------------


def request_path(wf: WorkloadFeatures) -> Tuple[Dict[int, str], Tuple[int, ...]]:
    """tid -> why it is on the request path, and the seeds."""
    threads = wf.threads
    path: Dict[int, str] = {}
    for t in threads.values():
        rate = t.external_wakeups_per_s(wf.duration_s)
        if rate >= SERVING_RATE:
            path[t.tid] = f"serves requests: {rate:.0f} wakeups/s from the network or other processes"
    if not path:
        top = max((t.cpu_share for t in threads.values()), default=0.0)
        for t in threads.values():
            if t.cpu_share >= max(BUSY_CPU, top * SELF_DRIVEN_SHARE):
                path[t.tid] = (f"drives the workload: {t.cpu_share:.2f} CPUs, among its busiest threads, and nothing "
                               "wakes the workload from outside")
    seeds = tuple(sorted(path))
    _grow(wf, path, lambda t: _joins_path(t, path, wf))
    return path, seeds


def _grow(wf: WorkloadFeatures, found: Dict[int, str], why_of) -> None:
    """Adds to `found` (tid -> why) every thread `why_of` gives a reason for, until none joins:
    a thread can join through one that joined after it was first looked at."""
    changed = True
    while changed:
        changed = False
        for t in wf.threads.values():
            if t.tid not in found:
                why = why_of(t)
                if why:
                    found[t.tid] = why
                    changed = True


def _share_of_wakeups(n: int, tid: int, wf: WorkloadFeatures) -> float:
    """n wakeups as a share of all those thread `tid` received in the window."""
    return n / max(1.0, wf.threads[tid].wakeups_per_s * wf.duration_s)


def _joins_path(t: ThreadFeatures, path: Dict[int, str], wf: WorkloadFeatures) -> Optional[str]:
    if t.wakeups_per_s == 0 and t.demand >= POLLING_DEMAND:
        return f"polls for work: wants {t.demand:.2f} CPUs and never slept in the window (an I/O thread spinning)"
    wakeups = t.wakeups_per_s * wf.duration_s  # timers and the network included
    from_path = sum(n for waker, n in t.wakers.items() if waker in path)
    if from_path and wakeups:
        share = min(1.0, from_path / wakeups)
        rate = from_path / wf.duration_s
        if share >= DRIVEN_SHARE and (rate >= CHAIN_RATE or t.cpu_share >= BUSY_CPU):
            return f"driven by the request path: {share:.0%} of its wakeups ({rate:.1f}/s) come from it"
    for wakee, n in sorted(t.wakees.items(), key=lambda item: -item[1]):
        if wakee not in path:
            continue
        rate = n / wf.duration_s
        share = _share_of_wakeups(n, wakee, wf)
        if rate >= CHAIN_RATE and share >= WAITED_ON_SHARE:
            return (f"the request path waits on it: it gives {wf.threads[wakee].comm} {share:.0%} of its wakeups "
                    f"({rate:.1f}/s)")
    return None


def waited_on(wf: WorkloadFeatures, path: Dict[int, str]) -> Dict[int, str]:
    """tid -> why the request path waits on it now and then: off the path, it gives a path thread
    (or a thread found here) WAITED_NOW_AND_THEN_SHARE of that thread's wakeups or more, and such
    threads WAITED_ON_EVENTS wakeups at least."""
    waited = dict(path)  # the path and the threads found so far: waiting on one of them is waiting

    def why_of(t: ThreadFeatures) -> Optional[str]:
        waiting = {w: n for w, n in t.wakees.items() if w in waited}
        n = sum(waiting.values())
        if n < WAITED_ON_EVENTS:
            return None
        most = max(waiting, key=lambda w: (_share_of_wakeups(waiting[w], w, wf), -w))
        share = _share_of_wakeups(waiting[most], most, wf)
        if share < WAITED_NOW_AND_THEN_SHARE:
            return None
        via = "" if most in path else ", which the request path waits on"
        return (f"the request path waits on it now and then: it wakes such threads {n / wf.duration_s:.1f} times "
                f"a second, {share:.1%} of {wf.threads[most].comm}'s wakeups{via}")

    _grow(wf, waited, why_of)
    return {tid: why for tid, why in waited.items() if tid not in path}


# ---- 2. classes ------------------------------------------------------------------------------


def classify_thread(t: ThreadFeatures, path_why: Optional[str], seed: bool, waited_why: Optional[str] = None) -> Verdict:
    if path_why is None:
        if waited_why is not None and t.cpu_share < BUSY_CPU:
            return Verdict(t.tid, False, f"{waited_why}; at {t.cpu_share:.3f} CPUs, yielding it would free nothing",
                           BACKGROUND, UNTREATED)
        return Verdict(t.tid, False, "not on the request path", BACKGROUND, YIELD)
    if t.cpu_share >= HOT_CPU:
        cls = SYNC_COMPUTE if t.burst_p50_us >= LONG_BURST_US else LATENCY_CRITICAL
        return Verdict(t.tid, True, path_why, cls, EXCLUSIVE)
    cls = IO_WAKE_CHAIN if not seed and t.d_share >= IO_D_SHARE else LATENCY_CRITICAL
    return Verdict(t.tid, True, path_why, cls, LATENCY)


# ---- 3. groups ---------------------------------------------------------------------------------


@dataclass
class _Group:
    """Threads selected together: by a name key, a title key or as the busiest of a process."""

    selector: str
    pattern: Optional[str]  # the glob or title regex; None for busiest / catch-all
    tids: List[int] = field(default_factory=list)
    cls: str = BACKGROUND
    treatment: str = YIELD
    note: str = ""


def _foremost(tids: Sequence[int], verdicts: Dict[int, Verdict], wf: WorkloadFeatures) -> Verdict:
    return max((verdicts[t] for t in tids),
               key=lambda v: (RANK[v.treatment], v.on_path, wf.threads[v.tid].cpu_share, -v.tid))


def _pool_lead(tids: Sequence[int], verdicts: Dict[int, Verdict], wf: WorkloadFeatures) -> Verdict:
    """The verdict a pool takes (a named group, or the busy path threads of an unnamed one): its
    foremost member's, unless that makes the pool exclusive while fewer than half of its members on
    the path are hot; then its foremost member below the mark. Four handlers at 0.2 CPUs of which
    one reached 0.31 in one window are a latency pool: judged by its busiest member, the pool
    changed treatment from one training to the next."""
    lead = _foremost(tids, verdicts, wf)
    if lead.treatment != EXCLUSIVE:
        return lead
    hot = [t for t in tids if verdicts[t].treatment == EXCLUSIVE]  # only path threads are ever exclusive
    if 2 * len(hot) >= sum(1 for t in tids if verdicts[t].on_path):
        return lead
    return _foremost([t for t in tids if t not in hot], verdicts, wf)


def _split_titles(tids: Sequence[int], verdicts, wf: WorkloadFeatures, titles_seen: Dict[int, List[str]]) -> List[_Group]:
    """Threads of a process-per-connection server, one group per role: processes of one
    treatment, selected by the keys of their titles."""
    by_pid: Dict[int, List[int]] = {}
    for tid in tids:
        by_pid.setdefault(wf.threads[tid].pid, []).append(tid)
    per_key: Dict[str, List[int]] = {}
    for pid, members in sorted(by_pid.items()):
        titles_seen.setdefault(pid, [wf.titles.get(pid, "")])
        per_key.setdefault(title_key(titles_seen[pid]), []).extend(members)
    groups = []
    for key, members in per_key.items():
        lead = _foremost(members, verdicts, wf)
        groups.append(_Group("process_titles", key, sorted(members), lead.cls, lead.treatment,
                             "every process carries the same thread name; process titles tell them apart"))
    return _merge_title_keys(groups, titles_seen, {tid: wf.threads[tid].pid for tid in tids})


def _merge_title_keys(groups: List[_Group], titles: Dict[int, List[str]], pid_of: Dict[int, int]) -> List[_Group]:
    """Keys of one treatment that differ only in their last word (a backend's state: idle,
    SELECT ...) become their common prefix, unless that prefix would also select a process of
    another treatment."""
    out: List[_Group] = []
    for group in groups:
        assert group.pattern is not None
        words = group.pattern.split(" ")
        for other in out:
            other_words = (other.pattern or "").split(" ")
            if not (other.treatment == group.treatment and len(words) == len(other_words) >= 4
                    and words[:-1] == other_words[:-1]):
                continue
            prefix = " ".join(words[:-1])
            strangers = [t for g in groups if g.treatment != group.treatment for t in g.tids]
            if any(re.search(title_regex([prefix]), title) for tid in strangers
                   for title in titles.get(pid_of[tid], ())):
                continue
            other.pattern = prefix
            other.tids = sorted(other.tids + group.tids)
            break
        else:
            out.append(group)
    return out


_DIGITS = re.compile(r"\d+")
# A run of digits in a title (a pid, a port, an address's octets) as a bounded repeat: a
# connection's title has a dozen of them, and the profile checks refuse more than a few
# unbounded ones (each multiplies matching time by the title's length).
DIGIT_RUN = r"\d{1,10}"


def _title_words(title: str) -> List[str]:
    words = title.split()
    if words and words[0].startswith("/"):  # a command line: the program, not its options
        cut = next((i for i, w in enumerate(words) if w.startswith("-")), len(words))
        words = words[:max(1, cut)][:1]
    return words[:8]


def title_key(titles: Sequence[str]) -> str:
    """The words every title of a process shared, digits generalised: a regex body (escaped,
    runs of digits as DIGIT_RUN) for `process_titles`."""
    word_lists = [[_DIGITS.sub("#", w) for w in _title_words(t)] for t in titles if t]
    if not word_lists:
        return ""
    common: List[str] = []
    for column in zip(*word_lists):
        if any(w != column[0] for w in column):
            break
        common.append(column[0])
    return " ".join(re.escape(w).replace("\\#", "#").replace("#", DIGIT_RUN) for w in common)


def title_regex(keys: Iterable[str]) -> str:
    alternatives = sorted(set(keys), key=lambda k: (-len(k), k))
    body = alternatives[0] if len(alternatives) == 1 else "(?:" + "|".join(alternatives) + ")"
    return f"^{body}(\\s|$)"


def _groups(wf: WorkloadFeatures, verdicts: Dict[int, Verdict], titles_seen: Dict[int, List[str]]) -> List[_Group]:
    by_key: Dict[str, List[int]] = {}
    for tid, t in sorted(wf.threads.items()):
        by_key.setdefault(t.key, []).append(tid)
    groups: List[_Group] = []
    for key, tids in sorted(by_key.items()):
        process_names = {name_key(wf.threads[t].process_name) for t in tids}
        treatments = {verdicts[t].treatment for t in tids}
        pids = {wf.threads[t].pid for t in tids}
        if key not in process_names or len(treatments) == 1 and len(pids) == 1:
            lead = _pool_lead(tids, verdicts, wf)
            groups.append(_Group("thread_names", key, tids, lead.cls, lead.treatment))
        elif len(pids) > 1:
            groups.extend(_split_titles(tids, verdicts, wf, titles_seen))
        elif not any(verdicts[t].on_path for t in tids):  # nothing to pick as the busiest
            lead = _foremost(tids, verdicts, wf)
            groups.append(_Group("catch_all", None, tids, lead.cls, lead.treatment,
                                 f"the threads named {wf.threads[tids[0]].comm!r}"))
        else:
            top_rank = max(RANK[verdicts[t].treatment] for t in tids)
            hot = [t for t in tids if RANK[verdicts[t].treatment] == top_rank]
            if verdicts[hot[0]].on_path:  # the busy path threads are one pool, however the load fell on them
                hot += [t for t in tids if t not in hot and verdicts[t].on_path and wf.threads[t].cpu_share >= BUSY_CPU]
            rest = [t for t in tids if t not in hot]
            lead = _pool_lead(hot, verdicts, wf)
            note = (f"every thread is named {wf.threads[tids[0]].comm!r}; the {len(hot)} busiest are this group, "
                    "picked by recent CPU time")
            groups.append(_Group("busiest", None, hot, lead.cls, lead.treatment, note))
            if rest:
                lead = _foremost(rest, verdicts, wf)
                groups.append(_Group("catch_all", None, rest, lead.cls, lead.treatment,
                                     f"the other threads named {wf.threads[tids[0]].comm!r}"))
    return groups


# ---- 4. clusters and sizing ---------------------------------------------------------------------


CLUSTER_NAMES = {SYNC_COMPUTE: "sync-compute", LATENCY_CRITICAL: "latency-critical", IO_WAKE_CHAIN: "io-wake-chain",
                 BACKGROUND: "background"}


def cores_needed(threads: Sequence[ThreadFeatures]) -> int:
    """Whole cores for an exclusive group: one per hot thread, at least its busy threads' CPU
    rounded up, never more than its busy threads."""
    busy = [t for t in threads if t.cpu_share >= BUSY_CPU]
    hot = sum(1 for t in busy if t.cpu_share >= HOT_CPU)
    demand = math.ceil(round(sum(t.cpu_share for t in busy), 2) - 0.05)
    return max(1, min(len(busy) or 1, max(hot, demand)))


def _clusters(groups: List[_Group], wf: WorkloadFeatures) -> List[Cluster]:
    merged: Dict[Tuple[str, str, str], Cluster] = {}
    if any(g.treatment == UNTREATED for g in groups):
        # A yield catch-all would yield the untreated threads too: the unnamed rest stays untreated as
        # well. A latency catch-all takes them (favouring a thread the path waits on is no harm).
        for g in groups:
            if g.selector == "catch_all" and g.treatment == YIELD:
                g.treatment = UNTREATED
    catch_all = [g for g in groups if g.selector == "catch_all"]
    background_is_catch_all = not catch_all and not any(g.treatment == UNTREATED for g in groups)
    for g in groups:
        if g.treatment == UNTREATED:
            continue
        selector = g.selector
        if background_is_catch_all and g.cls == BACKGROUND and selector == "thread_names":
            selector = "catch_all"
        merge_key = (g.cls, g.treatment, selector)
        cluster = merged.get(merge_key)
        if cluster is None or selector == "busiest":
            name = CLUSTER_NAMES[g.cls]
            if any(c.name == name for c in merged.values()):
                name = f"{name}-{len(merged) + 1}"
            cluster = Cluster(name, g.cls, g.treatment, selector, note=g.note)
            merged[merge_key if selector != "busiest" else (g.cls, g.treatment, f"busiest{len(merged)}")] = cluster
        if selector == "busiest":
            cluster.busiest = len(g.tids)
        elif g.pattern is not None and selector != "catch_all":
            cluster.patterns = cluster.patterns + (g.pattern,)
        cluster.tids = tuple(sorted(cluster.tids + tuple(g.tids)))
    clusters = list(merged.values())
    left = tuple(t for g in groups if g.treatment == UNTREATED for t in g.tids)
    for cluster in clusters:
        if cluster.selector == "catch_all":  # it selects every thread no other group does
            cluster.tids = tuple(sorted(cluster.tids + left))
    for cluster in clusters:
        if cluster.selector == "process_titles":
            cluster.patterns = (title_regex(cluster.patterns),)
        if cluster.treatment == EXCLUSIVE:
            cluster.cores = cores_needed([wf.threads[t] for t in cluster.tids])
    # The matcher tries groups in order and the first match wins: titles with longer keys first,
    # the catch-all last.
    order = {"process_titles": 0, "thread_names": 1, "busiest": 2, "catch_all": 3}
    clusters.sort(key=lambda c: (order[c.selector], -max((len(p) for p in c.patterns), default=0), c.name))
    return clusters


def analyze(wf: WorkloadFeatures, budget: float, budget_reason: str,
            titles_seen: Optional[Dict[int, List[str]]] = None) -> Analysis:
    """The request path, each thread's class and treatment, and the clusters that become the
    profile's thread groups. `titles_seen`: pid -> every title the process showed."""
    path, seeds = request_path(wf)
    waited = waited_on(wf, path)
    verdicts = {tid: classify_thread(t, path.get(tid), tid in seeds, waited.get(tid)) for tid, t in wf.threads.items()}
    clusters = _clusters(_groups(wf, verdicts, titles_seen or {}), wf)
    return Analysis(wf, verdicts, clusters, seeds, budget, budget_reason)


def wakers_summary(t_list: Sequence[ThreadFeatures], wf: WorkloadFeatures, n: int = 3) -> str:
    """The top wakers of some threads, by role: thread names of the workload, network, timer, outside."""
    counts: Dict[str, int] = {}
    for t in t_list:
        for kind in (NETWORK, INTERRUPT, OUTSIDE):
            if t.woken_by.get(kind):
                label = {NETWORK: "network", INTERRUPT: "timer/interrupt", OUTSIDE: "other processes"}[kind]
                counts[label] = counts.get(label, 0) + t.woken_by[kind]
        for waker, count in t.wakers.items():
            label = wf.threads[waker].key if waker in wf.threads else str(waker)
            counts[label] = counts.get(label, 0) + count
    total = sum(counts.values())
    if not total:
        return "none"
    return ", ".join(f"{label} {count / total:.0%}" for label, count in
                     sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:n])

