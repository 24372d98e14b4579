"""A LayerPlan as a scx_layered configuration (a JSON array of layer specs).

How each planned layer is expressed:

- Membership. A layer is matched by the workload's cgroup (CgroupPrefix, the cgroup v2 path
  without the leading '/' and with the trailing '/' so `a.service/` does not also match
  `a.service2/`) AND a thread-name prefix (CommPrefix) per thread-name glob, one OR block each.
  Workloads without a unit cgroup are matched by TGIDEquals per process instead. Process-title
  selectors and "the N busiest threads" have no scx_layered match: they are expressed by the
  process / thread ids the planner saw, which go stale as processes come and go (the next plan
  renders them again). Every approximation is reported as a RenderNote.
- Thread-name globs become prefixes: `ib_*` is exactly the prefix `ib_`; a name without a
  wildcard (`connection`) also matches longer names that start with it (scx_layered has no
  exact-name match); a wildcard before the end (`ib_*_wr`) widens to the literal part before it
  (`ib_`); prefixes are cut to 15 bytes (the kernel keeps 15 bytes of a thread name, so for a
  literal name that is exact). A glob that starts with a wildcard has no prefix at all; it is
  left out (its threads fall to later layers), and a layer left with nothing falls back to its
  member thread ids.
- Order. scx_layered puts a task in the first layer that matches, so catch-all layers
  (a workload's remaining threads, tier layers) come after every specific layer; otherwise
  the plan's order is kept. A final `[[]]` Open layer takes everything else. The order ranks
  nothing beyond matching.
- Kinds: backends/scx/kinds.py (treatments and tiers as scx_layered's three strict levels:
  preempting, standard, the low fallback queue; exclusive groups owned or fenced).
- What is not expressed: which CPUs a layer gets (scx_layered chooses cores itself; the plan's
  CPU numbers are a count here), and per-thread nice / SCHED_BATCH / SCHED_IDLE (the levels
  stand in for them).

The result is checked with the validator; a plan that cannot be expressed (more than 16
layers with the catch-all, more than 32 OR blocks, more exclusive CPUs than the host has, ...)
raises RenderError listing every problem.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

from temperd.plan import OPEN, Layer, LayerPlan
from temperd.backends.scx.kinds import exclusive_count, partial_cores, render_kind
from temperd.backends.scx.checks.spec import MAX_COMM_BYTES, MAX_LAYERS, MAX_ORS
from temperd.backends.scx.validate import errors_of, validate_config

CATCH_ALL_NAME = "rest"
GLOB_CHARS = "*?["


@dataclass(frozen=True)
class RenderNote:
    """Something the rendered config does differently from the plan (or cannot do)."""

    layer: str  # the layer's name; "" for the whole plan
    message: str

    def __str__(self) -> str:
        return f"{self.layer}: {self.message}" if self.layer else self.message


class RenderError(ValueError):
    """The plan cannot be expressed as a scx_layered config; `problems` says why, one per item."""

    def __init__(self, problems: Sequence[str]):
        self.problems = tuple(problems)
        super().__init__("the plan cannot be expressed as a scx_layered config: " + "; ".join(self.problems))


PARTIAL_CORE_OPTION = "--allow-partial-core"


@dataclass(frozen=True)
class Rendered:
    config: List[dict]
    notes: Tuple[RenderNote, ...]
    options: Tuple[str, ...] = ()  # scx_layered command-line options this config is meant to run with

    def to_json(self) -> str:
        return json.dumps(self.config, indent=2) + "\n"


@dataclass(frozen=True)
class CommPrefix:
    pattern: str
    prefix: Optional[str]  # None: the glob has no literal prefix
    exact: bool  # the prefix matches exactly the names the glob matches
    note: Optional[str]


def comm_prefix(pattern: str) -> CommPrefix:
    """The CommPrefix that expresses a thread-name glob, and how far it is off."""
    cut = min((i for i in (pattern.find(c) for c in GLOB_CHARS) if i >= 0), default=len(pattern))
    literal, rest = pattern[:cut], pattern[cut:]
    if not literal:
        return CommPrefix(pattern, None, False,
                          f"thread-name glob {pattern!r} starts with a wildcard: no CommPrefix can express it")
    prefix = _cut_bytes(literal, MAX_COMM_BYTES)
    truncated = prefix != literal
    if rest and rest.strip("*") == "":
        note = (f"thread-name glob {pattern!r}: prefix cut to {MAX_COMM_BYTES} bytes, {prefix!r}"
                if truncated else None)
        return CommPrefix(pattern, prefix, not truncated, note)
    if not rest:
        note = f"thread name {pattern!r} matches as a prefix: longer names that start with it match too"
        if truncated:
            note = (f"thread name {pattern!r} is longer than the kernel's {MAX_COMM_BYTES}-byte thread names: matched by "
                    f"its first {MAX_COMM_BYTES} bytes {prefix!r}, which longer names share")
        return CommPrefix(pattern, prefix, False, note)
    return CommPrefix(pattern, prefix, False,
                      f"thread-name glob {pattern!r} has a wildcard before its end: widened to the prefix {prefix!r}, "
                      "which may take threads meant for later layers")


def _cut_bytes(text: str, limit: int) -> str:
    raw = text.encode("utf-8")
    if len(raw) <= limit:
        return text
    return raw[:limit].decode("utf-8", errors="ignore")


def cgroup_prefix(cgroup: Optional[str]) -> Optional[str]:
    """`/system.slice/x.service` → `system.slice/x.service/`; None for no cgroup or the root."""
    if not cgroup:
        return None
    relative = cgroup.strip("/")
    return relative + "/" if relative else None


def _dedupe_prefixes(prefixes: Sequence[str]) -> List[str]:
    """Drop repeats and prefixes a shorter one already covers ("ib_" covers "ib_io"), keeping order."""
    unique = list(dict.fromkeys(prefixes))
    return [p for p in unique if not any(q != p and p.startswith(q) for q in unique)]


class _LayerRender:
    def __init__(self, layer: Layer):
        self.layer = layer
        self.notes: List[str] = []
        self.errors: List[str] = []

    def matches(self) -> List[List[dict]]:
        sel = self.layer.selector
        if sel.title_patterns:
            self.notes.append("process titles (" + ", ".join(repr(p) for p in sel.title_patterns) + ") have no "
                              "scx_layered match: matched by the processes the planner saw")
            return self._by_ids()
        if sel.comm_patterns:
            prefixes: List[str] = []
            dropped: List[str] = []
            plain: List[str] = []  # names without a wildcard, one note for all of them
            for found in (comm_prefix(p) for p in sel.comm_patterns):
                if found.prefix is None:
                    dropped.append(found.pattern)
                else:
                    prefixes.append(found.prefix)
                if found.prefix == found.pattern and not found.exact:
                    plain.append(found.pattern)
                elif found.note:
                    self.notes.append(found.note)
            if plain:
                names = ", ".join(repr(p) for p in plain)
                self.notes.append((f"thread names {names} match as prefixes: longer names that start with them match too"
                                   if len(plain) > 1 else
                                   f"thread name {names} matches as a prefix: longer names that start with it match too")
                                  + " (scx_layered has no exact thread-name match)")
            prefixes = _dedupe_prefixes(prefixes)
            if not prefixes:
                self.notes.append("no thread-name glob of this layer can be expressed: matched by the member "
                                  "threads the planner saw")
                return self._by_ids(threads_only=True)
            if dropped:
                self.notes.append("left out " + ", ".join(repr(p) for p in dropped) + ": threads matching only those "
                                  "fall to later layers")
            return self._in_workload([[{"CommPrefix": p}] for p in prefixes])
        if sel.catch_all and (sel.excluded_tids or sel.excluded_comm_patterns or sel.excluded_title_patterns):
            self.notes.append("another group of the workload has no layer (not granted, or no members): its "
                              "threads are left alone, so this catch-all is matched by the member threads the "
                              "planner saw")
            return self._by_ids(threads_only=True)
        if sel.catch_all:
            return self._in_workload([[]])
        self.notes.append("members chosen by runtime (busiest threads) have no scx_layered match: matched by the "
                          "thread ids the planner chose")
        return self._by_ids(threads_only=True)

    def _in_workload(self, blocks: List[List[dict]]) -> List[List[dict]]:
        """Each AND block within the workload: its cgroup, else each of its processes."""
        sel = self.layer.selector
        cgroup = cgroup_prefix(sel.cgroup)
        if cgroup:
            return [[{"CgroupPrefix": cgroup}, *block] for block in blocks]
        if not sel.pids:
            self.errors.append("the workload has neither a cgroup nor processes to match")
            return []
        return [[{"TGIDEquals": pid}, *block] for pid in sel.pids for block in blocks]

    def _by_ids(self, threads_only: bool = False) -> List[List[dict]]:
        """A whole process by TGIDEquals where a member is its leader, else the thread by PIDEquals."""
        sel = self.layer.selector
        pids = set() if threads_only else set(sel.pids)
        leaders = sorted(t for t in sel.tids if t in pids)
        threads = sorted(t for t in sel.tids if t not in pids)
        if not leaders and not threads:
            self.errors.append("no member threads to match")
        return [[{"TGIDEquals": t}] for t in leaders] + [[{"PIDEquals": t}] for t in threads]


def _comment(layer: Layer) -> str:
    what = f"{layer.workload} group {layer.group}" if layer.group else f"{layer.workload or 'tier'} ({layer.tier} tier)"
    return f"temperd: {what}, {layer.treatment}"


def _is_catch_all(layer: Layer) -> bool:
    sel = layer.selector
    return sel.catch_all and not sel.comm_patterns and not sel.title_patterns


def render_plan(plan: LayerPlan, shape_cpu_count: int, *, gpu_support: bool = False) -> Rendered:
    """The plan as a validated scx_layered config plus notes on every approximation.

    Raises RenderError when the plan cannot be expressed."""
    errors: List[str] = []
    notes: List[RenderNote] = []
    ordered = [l for l in plan.layers if not _is_catch_all(l)] + [l for l in plan.layers if _is_catch_all(l)]
    if len(ordered) + 1 > MAX_LAYERS:
        errors.append(f"{len(ordered)} layers plus the catch-all exceed scx_layered's {MAX_LAYERS}")
    names = {l.name for l in ordered}
    rest = CATCH_ALL_NAME
    while rest in names:
        rest = "temperd-" + rest
    config: List[dict] = []
    exclusive_cpus = 0
    partial = partial_cores(ordered)
    for layer in ordered:
        part = _LayerRender(layer)
        matches = part.matches()
        kind = render_kind(layer, shape_cpu_count, part.notes, part.errors, partial)
        if len(matches) > MAX_ORS:
            part.errors.append(f"needs {len(matches)} OR blocks, scx_layered takes at most {MAX_ORS} "
                               "(too many processes or thread-name globs for one layer)")
        exclusive_cpus += exclusive_count(kind) or 0
        errors.extend(f"layer {layer.name}: {e}" for e in part.errors)
        notes.extend(RenderNote(layer.name, n) for n in part.notes)
        config.append({"name": layer.name, "comment": _comment(layer), "matches": matches, "kind": kind})
    config.append({"name": rest, "comment": "temperd: every task no layer above matches",
                   "matches": [[]], "kind": {OPEN: {}}})
    if exclusive_cpus > shape_cpu_count:
        errors.append(f"exclusive layers need {exclusive_cpus} CPUs together, the host has {shape_cpu_count}")
    if any(l.cpus for l in ordered):
        notes.append(RenderNote("", "scx_layered picks which cores a layer owns: the plan's CPU numbers become CPU counts"))
    if any(l.nice is not None or l.policy != "other" for l in ordered):
        notes.append(RenderNote("", "per-thread nice and SCHED_BATCH/SCHED_IDLE are not part of a scx_layered config; "
                                    "levels stand in for them: latency and exclusive groups preempt, the standard "
                                    "tier does not, yield groups and the background tier run from the low fallback "
                                    "queue (only where nothing else wants the CPU)"))
    if not errors:
        errors.extend(f"{p.path}: {p.message} [{p.rule}]"
                      for p in errors_of(validate_config(config, cpu_count=shape_cpu_count, gpu_support=gpu_support)))
    if errors:
        raise RenderError(errors)
    if partial:
        notes.append(RenderNote("", f"scx_layered runs with {PARTIAL_CORE_OPTION}: owned groups hold one CPU of "
                                    "each core, their SMT siblings stay every layer's"))
    return Rendered(config, tuple(notes), (PARTIAL_CORE_OPTION,) if partial else ())
