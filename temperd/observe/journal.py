"""What temperd did and why, for the journal at INFO: a workload matched (which rule, profile,
tier), its treatment applied (per group: threads, treatment, CPUs), a workload left (and what was
restored), settings someone else changed that temperd stopped fighting, and what a plan change
changed. One line per workload and event, never one per thread; threads that simply ended are
not news. Lines about the same workload and event are rate-limited (a workload whose threads
come and go does not fill the journal), and all lines together are capped per minute.

The daemon calls `Journal.applied(match, plan, result, trigger)` after every apply (whole or new
threads only) and `Journal.reloaded(...)` after a reload; both log and return their lines.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from temperd.plan import CONFINED, EXCLUSIVE, YIELD, Layer, LayerPlan, layer_changes
from temperd.sources.shape import format_cpulist

log = logging.getLogger("temperd")

SAME_EVENT_INTERVAL_S = 60.0  # a repeated event of one workload at most once a minute
LINES_PER_MINUTE = 30  # all journal lines together; the rest is counted and said once


@dataclass(frozen=True)
class _Seen:
    """A workload as last reported: what the journal compares the next plan with."""

    profile: Optional[str]
    tier: str
    source: str
    treatment: Tuple[Tuple[str, int, str], ...]  # (group, threads, "treatment, CPUs ...") per group layer

    def shape(self) -> Tuple[Tuple[str, str], ...]:
        """The treatment without thread counts: a change of it is news at once."""
        return tuple((group, text) for group, _, text in self.treatment)


def describe_layer(layer: Layer) -> str:
    """A group layer's treatment in words: "exclusive, CPUs 2-3", "latency, nice -7, slice 500 us"."""
    parts = [layer.treatment]
    if layer.treatment == YIELD:
        parts = [f"yield ({layer.policy}" + (f", nice {layer.nice})" if layer.nice is not None and layer.policy != "idle" else ")")]
    elif layer.nice is not None:
        parts.append(f"nice {layer.nice}")
    if layer.slice_us:
        parts.append(f"slice {layer.slice_us} us")
    if layer.cpus:
        parts.append(f"{'CPUs' if layer.kind == CONFINED else 'sharing CPUs'} {format_cpulist(layer.cpus)}")
        if layer.holds_cpus:
            parts.append(layer.holds_cpus)
        if layer.idle_resume_us is not None:  # the PM QoS bound on its own CPUs (pmqos.py; an Open layer's is not applied)
            parts.append("polling while idle" if layer.idle_resume_us == 0 else
                         f"idle exit within {layer.idle_resume_us} us")
        if layer.kind != CONFINED and layer.treatment == EXCLUSIVE:
            parts.append("demoted: not enough whole cores")
    return ", ".join(parts)


def _treatment(workload, layers: Sequence[Layer]) -> Tuple[Tuple[str, int, str], ...]:
    out = []
    for layer in layers:
        group = layer.group or "all threads"
        n = len(workload.members(layer.group) or layer.selector.tids) if layer.group else len(layer.selector.tids)
        out.append((group, n, describe_layer(layer)))
    return tuple(out)


def _counts(table: Mapping[str, int]) -> str:
    return ", ".join(f"{n} {kind}" for kind, n in sorted(table.items()) if n)


class Journal:
    def __init__(self, logger: logging.Logger = log, clock=time.monotonic,
                 same_event_interval_s: float = SAME_EVENT_INTERVAL_S, lines_per_minute: int = LINES_PER_MINUTE):
        self.logger = logger
        self.clock = clock
        self.same_event_interval_s = same_event_interval_s
        self.lines_per_minute = lines_per_minute
        self._seen: Dict[str, _Seen] = {}
        self._last: Dict[Tuple[str, str], float] = {}
        self._minute_start = -1e18
        self._minute_lines = 0
        self._suppressed = 0
        self._plan = LayerPlan(layers=(), reserve_cpus=())  # the last apply's plan
        self._workloads: Dict[str, Any] = {}  # the last apply's workloads, by key
        self._listed: Optional[list] = None  # the last apply's match.workloads (the next match's `since`)
        self._layers: Dict[str, List[Layer]] = {}  # the last apply's plan's layers, by workload, in plan order

    # ---- the events -----------------------------------------------------------------------------

    def applied(self, match, plan: LayerPlan, result=None, trigger: str = "") -> List[str]:
        """After an apply: workloads matched, treated (or treated differently), left; drift."""
        lines: List[Tuple[Tuple[str, str], str]] = []
        # Only workloads that are other objects than at the last apply, or whose layers are, can
        # have news (a match and a plan hand back the very objects they did not rebuild): the
        # others are not looked at, nor walked over where the match says what it built again.
        removed, added = layer_changes(self._plan, plan)
        touched, ended = self._changed_workloads(match)
        touched.update(layer.workload for layer in (*removed, *added))
        self._index_layers(removed, added)
        current, layers = self._workloads, self._layers
        said = set()  # workloads whose matched/left line already says their layers came or went
        for key in sorted(touched):
            workload = current.get(key)
            if workload is None:
                continue
            before = self._seen.get(key)
            seen = _Seen(workload.profile_id, workload.tier, workload.source, _treatment(workload, layers.get(key, ())))
            if before is None:
                said.add(key)
                pids = len(workload.pids)
                lines.append(((key, "matched"),
                              f"workload {key} matched: profile {workload.profile_id or 'none'}, tier {workload.tier}, "
                              f"by {workload.source} ({workload.reason}); {pids} process{'es' if pids != 1 else ''}, "
                              f"{len(workload.threads)} threads"))
            if seen.treatment and (before is None or before.treatment != seen.treatment):
                groups = "; ".join(f"{group}: {n} thread{'s' if n != 1 else ''} {text}" for group, n, text in seen.treatment)
                verb = "treated" if before is None or not before.treatment else "treatment changed"
                # A new shape (groups, treatments, CPUs: a process's threads arriving after it, a
                # reload) is said at once; only thread counts that come and go are rate-limited.
                shape_changed = before is None or before.shape() != seen.shape()
                event = (key, f"treated {seen.shape()}") if shape_changed else (key, "treated")
                lines.append((event, f"workload {key} {verb}: {groups}"))
            elif before is not None and (before.tier, before.profile) != (seen.tier, seen.profile):
                lines.append(((key, "retiered"), f"workload {key} now profile {seen.profile or 'none'}, tier {seen.tier} "
                                                 f"(was {before.profile or 'none'}, {before.tier})"))
            self._seen[key] = seen
        restored = dict(getattr(result, "restored", None) or {})
        for key in ended:
            del self._seen[key]
            said.add(key)
            what = f"{_counts(restored)} setting(s) restored" if restored else "nothing left to restore"
            lines.append(((key, "left"), f"workload {key} left (its processes ended or no longer match): {what}"))
        drift = dict(getattr(result, "drift", None) or {})
        if drift:
            lines.append((("", "drift"), f"{_counts(drift)} setting(s) temperd made were changed by someone else: "
                                          "left as found, temperd no longer sets them"))
        change = self._plan_change(plan, removed, added, said)
        if change:
            # keyed by what changed: a different change is news at once, the same one again is not
            lines.append(((change, "plan"), f"plan changed ({trigger or 'replan'}): {change}"))
        return self._emit(lines)

    def _changed_workloads(self, match) -> Tuple[set, List[str]]:
        """(the keys of workloads that are other objects than at the last apply, the keys of
        those reported before that ended); the last apply's workloads kept up to date. From the
        match's own account where it follows the last apply's match, else by comparing every one."""
        since = getattr(match, "since", None)
        if since is not None and since is self._listed:
            updated = {w.key: w for w in match.updated}
            touched = {key for key, w in updated.items() if self._workloads.get(key) is not w}
            self._workloads.update(updated)
            for key in match.ended:
                self._workloads.pop(key, None)
            ended = sorted(key for key in match.ended if key in self._seen and key not in updated)
        else:
            current = {w.key: w for w in match.workloads}
            touched = {key for key, w in current.items() if self._workloads.get(key) is not w}
            self._workloads = current
            ended = sorted(key for key in self._seen if key not in current)
        self._listed = match.workloads
        return touched, ended

    def _index_layers(self, removed: Sequence[Layer], added: Sequence[Layer]) -> None:
        """Each workload's layers, kept from the last apply's by the plan's changes (plan order:
        a plan appends the layers it makes)."""
        gone = {id(layer) for layer in removed}
        for key in {layer.workload for layer in removed}:
            kept = [layer for layer in self._layers.get(key, ()) if id(layer) not in gone]
            if kept:
                self._layers[key] = kept
            else:
                self._layers.pop(key, None)
        for layer in added:
            self._layers.setdefault(layer.workload, []).append(layer)

    def reloaded(self, ok: bool, generation: int, trigger: str, summary: str = "",
                 problems: Sequence[str] = ()) -> List[str]:
        """A reload and its result, one line (the problems themselves are logged as errors)."""
        if ok:
            text = f"reload ({trigger}) adopted: generation {generation}" + (f", {summary}" if summary else "")
        else:
            text = (f"reload ({trigger}) refused: {len(problems)} problem(s), generation {generation} keeps running"
                    + (f"; first: {problems[0]}" if problems else ""))
        return self._emit([(("", f"reload-{generation}-{ok}"), text)], limited=False)

    def stopped(self, result=None) -> List[str]:
        restored = dict(getattr(result, "restored", None) or {})
        text = "stopped: every changed thread restored" + (f" ({_counts(restored)} setting(s))" if restored else "")
        return self._emit([(("", "stopped"), text)], limited=False)

    # ---- helpers --------------------------------------------------------------------------------

    def _plan_change(self, plan: LayerPlan, removed_layers: Sequence[Layer], added_layers: Sequence[Layer],
                     said=frozenset()) -> str:
        """Layers added, removed, or with other CPUs; "" where nothing changed beyond the layers of
        workloads that matched or left in this apply (their own lines say so). The layers that
        are not other objects than in the last plan (layer_changes) are the same layers."""
        self._plan = plan
        before = {layer.name: layer for layer in removed_layers}
        now = {layer.name: layer for layer in added_layers}
        added = sorted(n for n, layer in now.items() if n not in before and layer.workload not in said)
        removed = sorted(n for n, layer in before.items() if n not in now and layer.workload not in said)
        moved = [f"{name} CPUs {format_cpulist(before[name].cpus) or 'none'} -> {format_cpulist(now[name].cpus) or 'none'}"
                 for name in sorted(now.keys() & before.keys()) if tuple(before[name].cpus) != tuple(now[name].cpus)]
        parts = []
        if added:
            parts.append("added " + ", ".join(added))
        if removed:
            parts.append("removed " + ", ".join(removed))
        parts.extend(moved)
        if parts:
            parts.append(f"{len(plan.layers)} layers, reserve CPUs {format_cpulist(plan.reserve_cpus) or 'none'}")
        return "; ".join(parts)

    def _emit(self, lines, limited: bool = True) -> List[str]:
        now = self.clock()
        out = []
        if now - self._minute_start >= 60.0:
            if self._suppressed:
                self.logger.info("journal: %d more line(s) in the last minute were left out", self._suppressed)
            self._minute_start, self._minute_lines, self._suppressed = now, 0, 0
        for key, text in lines:
            if limited and key[1].split(" ", 1)[0] in ("treated", "drift", "plan", "retiered"):
                if now - self._last.get(key, -1e18) < self.same_event_interval_s:
                    continue
            if limited and self._minute_lines >= self.lines_per_minute:
                self._suppressed += 1
                continue
            self._last[key] = now
            if key[1].startswith("treated "):  # counts-only changes wait a while after any treated line
                self._last[(key[0], "treated")] = now
            self._minute_lines += 1
            self.logger.info("%s", text)
            out.append(text)
        return out

