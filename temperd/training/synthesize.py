"""A profile TOML from an Analysis: pure text generation, checked by the strict profile loader.

The profile is keyed to the machine shape it was measured on; [fingerprint] matches the trained
workload (its executable, its unit; for an interpreter the script or jar on its command line);
[traits] come from the workload classifier (decide/classify) fed with the measured features;
one [[thread_groups]] per cluster, each with the evidence above it. Exclusive sizing comes from
measured demand: cpu_fraction is the largest value whose ceil(budget x fraction) equals the
whole cores the cluster's busy threads need (the 0.85-vs-0.9 lesson: 2.25 CPUs x 0.9 rounds up to
a third core for a two-thread server).
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

from temperd.config.daemon_config import CONFIG_SPEC
from temperd.config.errors import ConfigError
from temperd.config.profile import PROFILE_ID_PATTERN, Traits, parse_profile
from temperd.decide.classify import (BUSIEST_THREAD, CPU_CAPACITY, CPU_DEMAND, CPU_USED, D_STATE_SHARE, HOT_THREAD_CPUS,
                                     HOT_THREADS, Hints, WorkloadSignals, classify, traits_of)
from temperd.decide.planner import exclusive_cores
from temperd.plan import EXCLUSIVE, YIELD
from temperd.text import printable
from temperd.training.analyze import BUSY_CPU, Analysis, Cluster, wakers_summary
from temperd.training.features import ThreadFeatures
from temperd.training.samples import ProcessInfo

INTERPRETERS = re.compile(r"^(python[0-9.]*|java|node(js)?|ruby[0-9.]*|perl[0-9.]*|php[0-9.]*|dotnet|beam\.smp|bash|sh)$")


@dataclass(frozen=True)
class ShapeFacts:
    cores: int
    threads_per_core: int
    cpus: int
    description: str


def fraction_for(cores: int, budget: float) -> float:
    """The largest cpu_fraction (3 decimals, at most 1) with ceil(budget x fraction) == cores."""
    if budget <= 0:
        return 1.0
    fraction = min(1.0, math.floor(cores / budget * 1000) / 1000)
    while fraction > 0.001 and exclusive_cores(budget, fraction) > cores:
        fraction = round(fraction - 0.001, 3)
    return max(0.001, fraction)


def profile_id(requested: Optional[str], root: Optional[ProcessInfo]) -> str:
    if requested:
        return requested
    base = root.name if root else "workload"
    program = _program(root) if root else None
    if program is not None:
        base = os.path.splitext(os.path.basename(program))[0]
    slug = re.sub(r"[^a-z0-9-]+", "-", base.lower()).strip("-") or "workload"
    return f"{slug[:50]}-trained"


def _q(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _list(items: Sequence[str]) -> str:
    return "[" + ", ".join(_q(i) for i in items) + "]"


def _program(root: ProcessInfo) -> Optional[str]:
    """For an interpreter (python, java ...): the script, jar or class it runs."""
    if not INTERPRETERS.match(os.path.basename(root.exe or root.name)) or not root.titles:
        return None
    args = root.titles[0].split()
    return next((a for a in args[1:] if not a.startswith("-")), None)


def fingerprint(root: Optional[ProcessInfo]) -> Dict[str, List[str]]:
    """Executable and unit of the trained workload; for an interpreter, its program's argument."""
    if root is None:
        return {}
    out: Dict[str, List[str]] = {}
    exe_name = os.path.basename(root.exe or "")
    if root.exe and not INTERPRETERS.match(exe_name):
        out["executables"] = [root.exe]
        if root.name and not exe_name.startswith(root.name) and not set("*?[") & set(root.name):
            # A multi-call binary or a link (Debian's redis-server is redis-check-rdb): the name
            # it runs under says which program it is, to the reader and to the matcher.
            out["process_names"] = [root.name]
    else:
        program = _program(root)
        if program is not None:
            out["cmdline"] = [r"(^|\s|/)" + re.escape(os.path.basename(program)) + r"(\s|$)"]
        elif root.exe:
            out["executables"] = [root.exe]
    if root.unit and not root.unit.endswith(".scope"):
        out["units"] = [root.unit]
    return out


def traits(analysis: Analysis, tier: str = CONFIG_SPEC.default_of("default_tier")) -> Traits:
    threads = analysis.features.threads.values()
    used = sum(t.cpu_share for t in threads)
    demand = sum(t.demand for t in threads)
    hot = [t for t in threads if t.cpu_share >= HOT_THREAD_CPUS]
    d_shares = [t.d_share for t in threads if t.cpu_share >= BUSY_CPU]
    serving = any(c.treatment != YIELD for c in analysis.clusters)
    signals = WorkloadSignals(
        workload="trained", window_s=analysis.features.duration_s, window_goal_s=analysis.features.duration_s,
        tier=tier, sources=("schedstat", "task_state"),
        measured={CPU_USED: used, CPU_DEMAND: demand, CPU_CAPACITY: analysis.budget, HOT_THREADS: float(len(hot)),
                  BUSIEST_THREAD: max((t.cpu_share for t in threads), default=0.0),
                  D_STATE_SHARE: sum(d_shares) / len(d_shares) if d_shares else 0.0},
        hints=Hints("training: it serves requests", Traits(criticality="performance")) if serving else Hints())
    return Traits(**traits_of(classify(signals)))


def _evidence(cluster: Cluster, analysis: Analysis) -> List[str]:
    wf = analysis.features
    members: List[ThreadFeatures] = [wf.threads[t] for t in cluster.tids]
    busy = [t for t in members if t.cpu_share >= BUSY_CPU] or members
    names: Dict[str, int] = {}
    for t in members:
        names[t.comm] = names.get(t.comm, 0) + 1
    shown = ", ".join(f"{n} x{c}" if c > 1 else n for n, c in sorted(names.items(), key=lambda i: (-i[1], i[0]))[:6])
    total = sum(t.cpu_share for t in members)
    p50 = sorted(t.burst_p50_us for t in busy)[len(busy) // 2]
    p99 = max(t.burst_p99_us for t in busy)
    wakes = sum(t.wakeups_per_s for t in members)
    lines = [f"{cluster.name}: {cluster.cls} -> {cluster.treatment}",
             f"  threads: {len(members)} ({shown}); {sum(1 for t in members if t.cpu_share >= BUSY_CPU)} busy",
             f"  CPU: {total:.2f} CPUs in all, busiest thread {max(t.cpu_share for t in members):.2f}; "
             f"on-CPU bursts p50 {p50:g} us, p99 {p99:g} us",
             f"  wakeups: {wakes:.0f}/s; woken by {wakers_summary(members, wf)}"]
    lead = max(members, key=lambda t: (t.cpu_share, -t.tid))
    lines.append(f"  why: {analysis.verdicts[lead.tid].why}")
    if cluster.note:
        lines.append(f"  selector: {cluster.note}")
    if cluster.treatment == EXCLUSIVE:
        fraction = fraction_for(cluster.cores, analysis.budget)
        lines.append(f"  sizing: {cluster.cores} whole core(s) for the busy threads; ceil({analysis.budget:g} x "
                     f"{fraction:g}) = {exclusive_cores(analysis.budget, fraction)} ({analysis.budget_reason})")
    return lines


def _group_toml(cluster: Cluster, analysis: Analysis) -> List[str]:
    out = ["#  " + line.strip() if i else "# " + line for i, line in enumerate(_evidence(cluster, analysis))]
    out += ["[[thread_groups]]", f"name = {_q(cluster.name)}",
            f"description = {_q(f'{cluster.cls}: trained from {len(cluster.tids)} thread(s)')}"]
    if cluster.selector == "thread_names":
        out.append(f"thread_names = {_list(cluster.patterns)}")
    elif cluster.selector == "process_titles":
        out.append(f"process_titles = {_list(cluster.patterns)}")
    elif cluster.selector == "busiest":
        out.append(f"busiest = {cluster.busiest}")
    else:
        out.append("catch_all = true")
    out.append(f"treatment = {_q(cluster.treatment)}")
    if cluster.treatment == EXCLUSIVE:
        out.append(f"cpu_fraction = {fraction_for(cluster.cores, analysis.budget):g}")
    elif cluster.treatment == YIELD:
        out.append('yield_policy = "batch"')
    return out


def _untreated_lines(analysis: Analysis) -> List[str]:
    """The threads no group selects, and why (most often: the request path waits on them now and then)."""
    untreated = [analysis.features.threads[t] for t in analysis.untreated]
    if not untreated:
        return []
    names = sorted({t.key for t in untreated})
    lead = max(untreated, key=lambda t: (t.cpu_share, -t.tid))
    return [f"# Left untreated ({len(untreated)} threads: {', '.join(names[:8])}{', ...' if len(names) > 8 else ''}); "
            f"e.g. {lead.comm}: {analysis.verdicts[lead.tid].why}."]


def synthesize(analysis: Analysis, root: Optional[ProcessInfo], shape: ShapeFacts, *, requested_id: Optional[str] = None,
               load: Optional[str] = None, tier: str = CONFIG_SPEC.default_of("default_tier")) -> str:
    """The profile TOML text; raises ValueError when the result does not validate (a bug)."""
    pid = profile_id(requested_id, root)
    if not re.fullmatch(PROFILE_ID_PATTERN, pid):
        raise ValueError(f"id: expected lowercase letters, digits and '-' (at most 63), found {pid!r}")
    wf = analysis.features
    what = f"{root.name} (pid {root.pid})" if root else "the workload"
    head = [f"# {pid}: trained by `temperctl train` on {time.strftime('%Y-%m-%d %H:%M')} from {wf.duration_s:.1f} s of "
            f"{what}", f"# under load: {load}" if load else "# under whatever load it had (no --load given)",
            f"# Host: {shape.description}.",
            f"# {len(wf.threads)} threads observed; request path seeded by "
            + (", ".join(f"{wf.threads[t].comm} ({t})" for t in analysis.seeds[:4]) or "nothing") + ".",
            "# Classes: sync compute / latency critical (on the request path; exclusive when a thread uses "
            "0.3 CPUs or more), I/O wake chain (on the path, sleeping in D: latency), "
            "sporadic / background (yield with SCHED_BATCH; left untreated when near idle and the path "
            "waits on it now and then).",
            f"# Sizing is for a budget of {analysis.budget:g} CPUs ({analysis.budget_reason}); give the workload "
            "that budget with a [[binding]] cpus = ..., or temperd gives each exclusive thread a core.",
            *_untreated_lines(analysis),
            "schema_version = 1", f"id = {_q(pid)}",
            f"description = {_q(f'trained from {what}: ' + ', '.join(f'{c.name} {c.treatment}' for c in analysis.clusters))}",
            "", "[fingerprint]"]
    for key, values in fingerprint(root).items():
        head.append(f"{key} = {_list(values)}")
    head += ["", "[machine_shape]", f"cores = {shape.cores}", f"threads_per_core = {shape.threads_per_core}", "", "[traits]"]
    for key, value in vars(traits(analysis, tier)).items():
        if value is not None:
            head.append(f"{key} = {_q(value)}")
    body: List[str] = []
    for cluster in analysis.clusters:
        body += [""] + _group_toml(cluster, analysis)
    # Comments quote thread names and titles: escaped, so a newline in one cannot start a TOML line.
    text = "\n".join(printable(line) if line.startswith("#") else line for line in head + body) + "\n"
    try:  # the strict loader's verdict
        parse_profile(text, f"{pid}.toml")
    except ConfigError as exc:
        raise ValueError("; ".join(str(p) for p in exc.problems)) from None
    return text
