"""How a planned layer's treatment becomes a scx_layered layer kind.

Chosen from what scx_layered 1.1 does (scheds/rust/scx_layered/src/bpf/main.bpf.c:
layered_dispatch, layered_enqueue, try_preempt_cpu, keep_running; main.rs init_cpus), not from
the names of its settings. A layer sits on one of three levels, and the levels are strict:

1. Preempting layers (`preempt`). A shared CPU takes their tasks before any other layer's, and a
   waking task that finds no idle CPU preempts a task of a non-preempting layer at once. Two
   preempting layers cannot preempt each other. Here: latency groups and owners of CPUs.
2. Non-preempting Open layers: the final catch-all, i.e. the standard tier and everything
   temperd does not manage.
3. The low fallback queue. A task whose layer holds no CPUs waits there (layered_enqueue,
   `!layer->nr_cpus`), and a CPU runs it only when no layer has a task for it, apart from a
   floor of `--lo-fb-share` (5 %) of each CPU once it has waited `--lo-fb-wait-us` (10 ms). This
   is SCHED_IDLE's meaning, so the background tier and yield groups are Grouped layers held at
   zero CPUs (`cpus_range [0, 0]`). A Grouped task may still start on any idle unprotected CPU.
   keep_running never extends the slice of a task that ran from this queue, so a waiting
   standard-tier task (which cannot preempt) gets the CPU when that slice ends: the slice is
   short (YIELD_SLICE_US).

The order of layers in the config decides matching only (the first match wins). Dispatch walks
the layers of one level in an order shuffled per CPU. `weight` only divides CPUs among Confined
and Grouped layers (alloc.rs water_fill) and dispatch ignores it, so an Open layer carries none:
a weight-1 background layer once took 160-186 % of a CPU against the rest layer's 37 %.

Exclusive groups, by Layer.ownership:
- FENCED: Confined, `cpus_range [n, n]` (the layer's CPUs plus the SMT siblings kept idle:
  scx_layered counts logical CPUs and allocates whole cores), `protected` (no other layer's
  task is dispatched there or preempts there) and `exclusive` (a running member's SMT sibling
  stays idle).
- OWNED: Grouped, `cpus_range [n, n]`, not protected, `preempt` and `preempt_first`. Its CPUs
  serve its own queue first (layered_dispatch takes the owner layer before any other), other
  layers borrow them while that queue is empty, and a waking owner preempts a non-preempting
  borrower on its previous CPU at once. A preempting borrower (a latency group) is not
  preempted. It keeps the CPU while its own queue is empty, up to 20 slices (docs/scx-layered.md).
  Where no fenced layer holds SMT siblings, n is the layer's CPUs alone and scx_layered runs with
  `--allow-partial-core` (alloc_unit 1: single CPUs, not whole cores; lib.rs
  round_targets_to_alloc_units): the siblings stay every layer's, as the native backend leaves
  them to others, instead of being held by a group that may use a quarter of one CPU. Beside a
  fenced layer the flag could split that layer's cores (alloc_cpus takes what a core has left
  and moves on), so there owned layers keep their whole cores.
Grouped layers that hold CPUs (critical-tier layers without a profile) get a fixed count
`[k, k]` and `preempt` when they serve a latency or exclusive group.
"""

from __future__ import annotations

from typing import Dict, List, Optional

from temperd.backends.scx.checks.spec import MAX_WEIGHT
from temperd.plan import CONFINED, EXCLUSIVE, GROUPED, LATENCY, OPEN, OWNED, YIELD, Layer

FIXED_UTIL_RANGE = [0.0, 1.0]  # required for Confined/Grouped; with min = max CPUs it never resizes
YIELD_SLICE_US = 2000  # the longest a standard-tier task waits behind a background task (kernel tick granularity)

STANDARD = "standard"  # the catch-all's level: non-preempting Open
PREEMPTING = "preempting"
LOW_FALLBACK = "low fallback"


def level_of(layer: Layer) -> str:
    """Which of scx_layered's three levels the layer is put on."""
    if layer.treatment == YIELD:  # yield groups, and the background tier's own layers (the planner's yield)
        return LOW_FALLBACK
    if layer.treatment in (LATENCY, EXCLUSIVE):
        return PREEMPTING
    return STANDARD


def fixed_cpus(layer: Layer, partial: bool = False) -> int:
    """The CPU count a Confined or Grouped layer is held at: its CPUs and the SMT siblings kept idle;
    an owned layer's CPUs alone where scx_layered allocates single CPUs (partial: see partial_cores)."""
    if layer.kind not in (CONFINED, GROUPED):
        return 0
    if partial and is_owned(layer):
        return len(layer.cpus)
    return len(layer.cpus) + len(layer.idle_siblings)


def partial_cores(layers) -> bool:
    """Whether scx_layered may allocate single CPUs (--allow-partial-core): some owned layer has
    SMT siblings to leave to others, and no fenced layer holds siblings whose cores it could split."""
    exclusive = [l for l in layers if l.treatment == EXCLUSIVE and l.kind in (CONFINED, GROUPED) and l.idle_siblings]
    return any(is_owned(l) for l in exclusive) and not any(not is_owned(l) for l in exclusive)


def is_owned(layer: Layer) -> bool:
    """An exclusive group whose CPUs others may borrow while its threads sleep."""
    return layer.treatment == EXCLUSIVE and layer.ownership == OWNED and layer.kind in (CONFINED, GROUPED)


def render_kind(layer: Layer, cpu_count: int, notes: List[str], errors: List[str],
                partial: bool = False) -> Dict[str, dict]:
    """The layer's `kind` object; what it cannot express goes to notes, what is wrong to errors.
    partial: scx_layered runs with --allow-partial-core (see partial_cores)."""
    weight = max(1, min(MAX_WEIGHT, int(layer.weight)))
    level = level_of(layer)
    n = fixed_cpus(layer, partial)
    body: Dict[str, object] = {}
    kind = OPEN
    if level == LOW_FALLBACK:
        kind = GROUPED
        body.update(util_range=list(FIXED_UTIL_RANGE), cpus_range=[0, 0])
        if layer.cpus:
            notes.append("a yield layer holds no CPUs: it runs only where no other layer wants the CPU")
        if layer.policy == "batch":
            notes.append("SCHED_BATCH with nice has no scx_layered equivalent: it yields like SCHED_IDLE "
                         "(the low fallback queue), which is stricter")
    elif layer.kind == CONFINED and not is_owned(layer):
        kind = CONFINED
        _check_count(n, cpu_count, "Confined", errors)
        body.update(util_range=list(FIXED_UTIL_RANGE), cpus_range=[n, n], protected=True, exclusive=True, weight=weight)
        if layer.idle_siblings:
            notes.append(f"cpus_range [{n}, {n}]: {len(layer.cpus)} core(s) with their "
                         f"{len(layer.idle_siblings)} SMT sibling(s) kept idle (exclusive)")
    elif n:
        kind = GROUPED
        _check_count(n, cpu_count, "Grouped", errors)
        owned = is_owned(layer)
        body.update(util_range=list(FIXED_UTIL_RANGE), cpus_range=[n, n], protected=bool(layer.protected) and not owned)
        if owned:
            body.update(preempt=True, preempt_first=True)
            if layer.idle_siblings and partial:
                notes.append(f"cpus_range [{n}, {n}]: one CPU of each of its {len(layer.cpus)} core(s) owned, "
                             f"the {len(layer.idle_siblings)} SMT sibling(s) left to every layer "
                             "(--allow-partial-core)")
            elif layer.idle_siblings:
                body["exclusive"] = True
                notes.append(f"cpus_range [{n}, {n}]: {len(layer.cpus)} core(s) owned, their "
                             f"{len(layer.idle_siblings)} SMT sibling(s) idle while a member runs (exclusive)")
        elif level == PREEMPTING:
            body["preempt"] = True
        body["weight"] = weight
    else:
        if layer.kind == CONFINED:
            errors.append("a Confined layer without CPUs")
        elif layer.kind == GROUPED:
            notes.append("a Grouped layer without CPUs is rendered as Open")
        if level == PREEMPTING:
            body["preempt"] = True
    if level == LOW_FALLBACK:
        body["slice_us"] = min(int(layer.slice_us or YIELD_SLICE_US), YIELD_SLICE_US)
    elif layer.slice_us:
        body["slice_us"] = int(layer.slice_us)
    if layer.idle_resume_us == 0:
        # scx_layered writes its bound to pm_qos_resume_latency_us as a number, and the file reads
        # "0" as no constraint (a bound of 0 is "n/a"): rendered, it would set nothing.
        notes.append("idle_resume_us 0 (poll while idle) is not rendered: scx_layered writes 0, which "
                     "pm_qos_resume_latency_us reads as no constraint; these CPUs idle as they would")
    elif layer.idle_resume_us is not None:
        body["idle_resume_us"] = int(layer.idle_resume_us)
    return {kind: body}


def exclusive_count(kind: Dict[str, dict]) -> Optional[int]:
    """CPUs a rendered kind holds for itself (Confined, or an owned Grouped layer); None otherwise."""
    if CONFINED in kind:
        return kind[CONFINED]["cpus_range"][0]
    body = kind.get(GROUPED)
    if body and body.get("preempt_first") and body["cpus_range"][0]:
        return body["cpus_range"][0]
    return None


def _check_count(n: int, cpu_count: int, what: str, errors: List[str]) -> None:
    if n < 1:
        errors.append(f"a {what} layer without CPUs")
    elif n > cpu_count:
        errors.append(f"{what} on {n} CPUs but the host has {cpu_count}")
